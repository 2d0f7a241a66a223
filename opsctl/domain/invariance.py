"""Batch invariance: compare each prompt run alone (BS=1) with the same prompt run in a
batch (BS=N), token by token and logprob by logprob. Pure: no I/O, no UI.

Contract (vLLM PR 56528, and what `opsctl diag invariance` reports):
- Comparison is bitwise by default (``atol=None``: float equality); with ``atol`` a
  logprob difference up to ``atol`` counts as matching and the report says so.
- Fail closed: a request error, a missing output, fewer tokens than asked, a missing
  sampled logprob or fewer top logprobs than asked is a failure with its reason, never a
  pass and never a skip.
- Per prompt: ``identical`` (bitwise), ``within_atol``, ``diverged`` (first divergence
  and largest difference) or ``error`` (the fail-closed reason).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

IDENTICAL, WITHIN_ATOL, DIVERGED, ERROR = "identical", "within_atol", "diverged", "error"
PASSING = (IDENTICAL, WITHIN_ATOL)

TokenKey = int | str  # a token id, or the token string when the server gave no ids


@dataclass(frozen=True, slots=True)
class Generated:
    """One completion as the server returned it (already parsed, not yet validated)."""

    token_ids: tuple[TokenKey, ...] = ()
    logprobs: tuple[float | None, ...] = ()
    top_logprobs: tuple[dict[TokenKey, float] | None, ...] = ()
    finish_reason: str | None = None
    outputs: int = 1  # number of choices the server returned
    error: str | None = None  # request error (HTTP status, exception, bad JSON)
    has_logprobs: bool = True  # the response carried a logprobs object at all


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int
    kind: str  # token | logprob | top_logprobs
    token_alone: TokenKey | None
    token_batched: TokenKey | None
    logprob_alone: float | None
    logprob_batched: float | None
    diff: float | None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "kind": self.kind,
            "token_alone": self.token_alone,
            "token_batched": self.token_batched,
            "logprob_alone": self.logprob_alone,
            "logprob_batched": self.logprob_batched,
            "diff": self.diff,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class PromptResult:
    index: int
    status: str  # identical | within_atol | diverged | error
    reason: str = ""
    first_divergence: Divergence | None = None
    largest_diff: float | None = None  # max |Δlogprob| (sampled and top-k) while tokens agree
    largest_diff_position: int | None = None
    tokens_identical: bool | None = None
    compared_positions: int = 0

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "status": self.status,
            "reason": self.reason,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "largest_diff": self.largest_diff,
            "largest_diff_position": self.largest_diff_position,
            "tokens_identical": self.tokens_identical,
            "compared_positions": self.compared_positions,
        }


@dataclass(frozen=True, slots=True)
class Summary:
    verdict: str  # pass | fail
    prompts: int
    identical: int
    within_atol: int
    diverged: int
    errors: int
    tokens_identical: bool
    largest_diff: float | None
    comparison: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "prompts": self.prompts,
            "identical": self.identical,
            "within_atol": self.within_atol,
            "diverged": self.diverged,
            "errors": self.errors,
            "tokens_identical": self.tokens_identical,
            "largest_diff": self.largest_diff,
            "comparison": self.comparison,
            "reasons": list(self.reasons),
        }


def comparison_label(atol: float | None) -> str:
    return "bitwise" if atol is None else f"atol={atol:g}"


def validate(gen: Generated, max_tokens: int, logprobs: int) -> str | None:
    """The fail-closed check of one completion: None when usable, else the reason."""
    if gen.error:
        return f"request error: {gen.error}"
    if gen.outputs != 1:
        return f"expected 1 output, got {gen.outputs}"
    if not gen.has_logprobs:
        return "no logprobs in the response"
    n = len(gen.token_ids)
    if n < max_tokens:
        return f"fewer tokens than asked: {n} of {max_tokens} (finish_reason={gen.finish_reason})"
    if len(gen.logprobs) < n:
        return f"logprobs for {len(gen.logprobs)} of {n} tokens"
    for pos, lp in enumerate(gen.logprobs[:n]):
        if lp is None or not isinstance(lp, float | int) or math.isnan(lp):
            return f"missing logprob at position {pos}"
    if logprobs > 0:
        if len(gen.top_logprobs) < n:
            return f"top logprobs for {len(gen.top_logprobs)} of {n} tokens"
        for pos, top in enumerate(gen.top_logprobs[:n]):
            if top is None or len(top) < logprobs:
                got = 0 if top is None else len(top)
                return f"fewer top logprobs than asked at position {pos}: {got} of {logprobs}"
    return None


def _close(a: float, b: float, atol: float | None) -> bool:
    return a == b if atol is None else abs(a - b) <= atol


def compare(
    index: int,
    alone: Generated,
    batched: Generated,
    *,
    max_tokens: int,
    logprobs: int,
    atol: float | None = None,
) -> PromptResult:
    """Compare one prompt's BS=1 and BS=N completions (first ``max_tokens`` positions)."""
    for side, gen in (("BS=1", alone), ("BS=N", batched)):
        reason = validate(gen, max_tokens, logprobs)
        if reason:
            return PromptResult(index, ERROR, f"{side}: {reason}")
    first: Divergence | None = None
    largest: float | None = None
    largest_pos: int | None = None
    tokens_identical = True
    compared = 0
    for pos in range(max_tokens):
        ta, tb = alone.token_ids[pos], batched.token_ids[pos]
        la, lb = float(alone.logprobs[pos]), float(batched.logprobs[pos])  # type: ignore[arg-type]
        compared += 1
        if ta != tb:
            tokens_identical = False
            if first is None:
                first = Divergence(pos, "token", ta, tb, la, lb, abs(la - lb), "different token")
            break  # the sequences differ from here on: later positions are not comparable
        diffs = [(abs(la - lb), "logprob", "")]
        top_a = alone.top_logprobs[pos] if pos < len(alone.top_logprobs) else None
        top_b = batched.top_logprobs[pos] if pos < len(batched.top_logprobs) else None
        if logprobs > 0 and top_a is not None and top_b is not None:
            if set(top_a) != set(top_b):
                only_a = sorted(map(str, set(top_a) - set(top_b)))
                only_b = sorted(map(str, set(top_b) - set(top_a)))
                if first is None:
                    first = Divergence(
                        pos,
                        "top_logprobs",
                        ta,
                        tb,
                        la,
                        lb,
                        abs(la - lb),
                        f"top-{logprobs} sets differ: alone only {only_a}, batched only {only_b}",
                    )
            for tok in set(top_a) & set(top_b):
                diffs.append(
                    (abs(top_a[tok] - top_b[tok]), "top_logprobs", f"top logprob of token {tok}")
                )
        for d, kind, detail in diffs:
            if largest is None or d > largest:
                largest, largest_pos = d, pos
            if first is None and not _close(d, 0.0, atol):
                first = Divergence(
                    pos,
                    kind,
                    ta,
                    tb,
                    la,
                    lb,
                    abs(la - lb),
                    detail or "sampled token's logprob differs",
                )
    if first is not None:
        status = DIVERGED
    elif largest is not None and largest > 0.0:
        status = WITHIN_ATOL
    else:
        status = IDENTICAL
    return PromptResult(index, status, "", first, largest, largest_pos, tokens_identical, compared)


def summarize(
    results: list[PromptResult], atol: float | None, extra_failures: list[str] | None = None
) -> Summary:
    """Overall verdict: pass only when every prompt matched and nothing else failed."""
    counts = {
        s: sum(1 for r in results if r.status == s)
        for s in (IDENTICAL, WITHIN_ATOL, DIVERGED, ERROR)
    }
    reasons = [f"prompt {r.index}: {r.reason}" for r in results if r.status == ERROR]
    reasons += [
        f"prompt {r.index}: first divergence at position {r.first_divergence.position} ({r.first_divergence.kind})"
        for r in results
        if r.status == DIVERGED and r.first_divergence is not None
    ]
    reasons += list(extra_failures or [])
    diffs = [r.largest_diff for r in results if r.largest_diff is not None]
    ok = bool(results) and all(r.passed for r in results) and not extra_failures
    if not results:
        reasons.append("no prompts were compared")
    return Summary(
        "pass" if ok else "fail",
        len(results),
        counts[IDENTICAL],
        counts[WITHIN_ATOL],
        counts[DIVERGED],
        counts[ERROR],
        bool(results) and all(r.tokens_identical for r in results),
        max(diffs) if diffs else None,
        comparison_label(atol),
        tuple(reasons),
    )


# ---- settings: what was asked of the engine, and what it shows it got ----------------

VERIFIED, NOT_VERIFIED, MISMATCH, NOT_APPLICABLE, ENFORCED = (
    "verified",
    "not verified",
    "mismatch",
    "not applicable",
    "per request",
)


@dataclass(frozen=True, slots=True)
class SettingCheck:
    name: str
    wanted: str
    seen: str
    status: str  # verified | not verified | mismatch | not applicable | per request
    source: str

    @property
    def failed(self) -> bool:
        return self.status == MISMATCH

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "wanted": self.wanted,
            "seen": self.seen,
            "status": self.status,
            "source": self.source,
        }


def check_engine_settings(
    engine_info: dict | None, probe_env: dict | None, *, mode: str | None
) -> list[SettingCheck]:
    """Engine-level isolating settings against what the engine recorded.

    ``engine_info``: the engine_info probe's record (None: no ledger, e.g. an external
    server opsctl did not start). ``probe_env``: env vars as the engine process saw them
    (batch probe), None when unknown. ``mode``: "eager" | "default" | None (not chosen).
    """
    out: list[SettingCheck] = []
    src = "engine_info probe (EngineCore config)"
    if engine_info is None:
        why = "no opsctl ledger for this server: could not enforce or read back"
        out.append(SettingCheck("prefix caching", "off", "?", NOT_VERIFIED, why))
        out.append(SettingCheck("mm processor cache", "0 GiB", "?", NOT_VERIFIED, why))
    else:
        pc = engine_info.get("enable_prefix_caching")
        out.append(
            SettingCheck(
                "prefix caching", "off", _fmt(pc), VERIFIED if pc is False else MISMATCH, src
            )
        )
        mm = engine_info.get("mm_processor_cache_gb")
        if mm is None:
            out.append(
                SettingCheck(
                    "mm processor cache",
                    "0 GiB",
                    "no multimodal config",
                    NOT_APPLICABLE,
                    f"{src}: text-only model, flag accepted",
                )
            )
        else:
            out.append(
                SettingCheck(
                    "mm processor cache",
                    "0 GiB",
                    f"{mm} GiB",
                    VERIFIED if float(mm) == 0.0 else MISMATCH,
                    src,
                )
            )
    if probe_env is None:
        out.append(
            SettingCheck(
                "VLLM_USE_FLASHINFER_SAMPLER",
                "0",
                "?",
                NOT_VERIFIED,
                "batch probe not active in this engine: could not read its env",
            )
        )
    else:
        val = probe_env.get("VLLM_USE_FLASHINFER_SAMPLER")
        out.append(
            SettingCheck(
                "VLLM_USE_FLASHINFER_SAMPLER",
                "0",
                _fmt(val),
                VERIFIED if val == "0" else MISMATCH,
                "batch probe (engine worker env)",
            )
        )
    if mode is not None:
        want_eager = mode == "eager"
        if engine_info is None:
            out.append(
                SettingCheck(
                    "execution mode", mode, "?", NOT_VERIFIED, "no opsctl ledger for this server"
                )
            )
        else:
            eager = engine_info.get("enforce_eager")
            seen = f"enforce_eager={_fmt(eager)}, compilation={compilation_mode_name(engine_info.get('compilation_mode'))}"
            out.append(
                SettingCheck(
                    "execution mode", mode, seen, VERIFIED if eager is want_eager else MISMATCH, src
                )
            )
    return out


def check_request_settings(completions: list[Generated], max_tokens: int) -> list[SettingCheck]:
    """Per-request settings (sent with every request) checked against the responses:
    greedy -> the sampled token is the top-1 at every position; ignore_eos -> every
    completion ran to max_tokens with finish_reason "length"."""
    usable = [g for g in completions if g.error is None and g.has_logprobs]
    argmax_ok = True
    for g in usable:
        for pos, (tok, top) in enumerate(zip(g.token_ids, g.top_logprobs, strict=False)):
            if not top:
                continue
            best = max(top.values())
            lp = g.logprobs[pos] if pos < len(g.logprobs) else None
            if lp is None or lp < best:
                argmax_ok = False
            if tok not in top:
                argmax_ok = False
    lengths_ok = all(
        len(g.token_ids) >= max_tokens and g.finish_reason in ("length", None) for g in usable
    )
    src = "sent with every request; checked in the responses"
    return [
        SettingCheck(
            "greedy (temperature 0)",
            "argmax token",
            "argmax at every position" if argmax_ok else "a sampled token was not the top-1",
            VERIFIED if argmax_ok and usable else (MISMATCH if usable else NOT_VERIFIED),
            src,
        ),
        SettingCheck(
            "ignore_eos",
            "run to max_tokens",
            "every completion reached max_tokens" if lengths_ok else "a completion stopped early",
            VERIFIED if lengths_ok and usable else (MISMATCH if usable else NOT_VERIFIED),
            src,
        ),
    ]


COMPILATION_MODES = {
    "0": "NONE",
    "1": "STOCK_TORCH_COMPILE",
    "2": "DYNAMO_TRACE_ONCE",
    "3": "VLLM_COMPILE",
}


def compilation_mode_name(mode: object) -> str:
    """vLLM's CompilationMode as recorded by the engine_info probe ("2") -> its name."""
    text = str(mode)
    return COMPILATION_MODES.get(text, text.rsplit(".", 1)[-1])


def _fmt(v: object) -> str:
    return "?" if v is None else str(v)


# ---- the batch that formed ------------------------------------------------------------


def prompt_index(req_id: str, tag: str) -> int | None:
    """Which prompt an engine request id belongs to: ``...<tag>-g<start>-<hex8>-<i>-...``
    (one request carrying a group of prompts) or ``...<tag>-p<i>-...`` (one per prompt)."""
    m = re.search(re.escape(tag) + r"-g(\d+)-[0-9a-f]{8}-(\d+)", req_id)
    if m:
        return int(m[1]) + int(m[2])
    m = re.search(re.escape(tag) + r"-p(\d+)-", req_id)
    return int(m[1]) if m else None


@dataclass(frozen=True, slots=True)
class BatchEvidence:
    source: str  # "batch probe" | "metrics (...)" | "none"
    max_batch: int | None  # largest number of this run's BS=N requests sampled together
    steps: int = 0  # sampling steps that included this run's BS=N requests
    wanted: int = 0
    alone: tuple[int, ...] = ()  # prompts never sampled together with another of ours
    per_prompt: dict[int, int] = field(default_factory=dict)  # prompt -> largest co-batch

    @property
    def formed(self) -> bool | None:
        if self.max_batch is None:
            return None
        return self.max_batch >= 2 and not self.alone

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "max_batch": self.max_batch,
            "steps": self.steps,
            "wanted": self.wanted,
            "formed": self.formed,
            "alone": list(self.alone),
            "per_prompt": {str(k): v for k, v in sorted(self.per_prompt.items())},
        }


def batch_from_probe(steps: list[dict], tag: str, wanted: int) -> BatchEvidence | None:
    """From batch-probe step records: how many of this run's BS=N requests (ids carrying
    ``tag``) were sampled in one step, overall and per prompt. None when no step
    included them (probe not active in that engine)."""
    best, n = 0, 0
    per_prompt: dict[int, int] = {}
    for s in steps:
        if s.get("event") != "step":
            continue
        ours = [
            i for i in (prompt_index(str(r), tag) for r in s.get("req_ids") or []) if i is not None
        ]
        if not ours:
            continue
        n += 1
        best = max(best, len(ours))
        for i in ours:
            per_prompt[i] = max(per_prompt.get(i, 0), len(ours))
    if n == 0:
        return None
    alone = tuple(sorted(i for i, k in per_prompt.items() if k < 2))
    return BatchEvidence("batch probe", best, n, wanted, alone, per_prompt)


def shared_steps(steps: list[dict], tag: str) -> int:
    """Largest batch (any requests) that a BS=1 request of this run was sampled in:
    above 1 means other traffic shared its steps, so that side was not truly BS=1."""
    best = 0
    for s in steps:
        if s.get("event") != "step":
            continue
        ids = [str(r) for r in s.get("req_ids") or []]
        if any(prompt_index(r, tag) is not None for r in ids):
            best = max(best, len(ids))
    return best


def batch_from_metrics(running_samples: list[float], wanted: int) -> BatchEvidence:
    if not running_samples:
        return BatchEvidence("none", None, 0, wanted)
    return BatchEvidence(
        "metrics (peak vllm:num_requests_running)",
        int(max(running_samples)),
        len(running_samples),
        wanted,
    )
