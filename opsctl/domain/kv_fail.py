"""`diag kv-fail` logic: workload, what the connector can serve, accounting from the
engine's own log lines, output comparison, findings and verdict. Pure (no I/O).

The diag runs one engine with the fault-injecting connector through phases:
``store`` (failure-free baseline; the connector stores every prompt's KV),
``roundtrip`` (the same prompts reload their KV, nothing injected: outputs must equal
the baseline), ``inject`` (reload with failures injected: the engine must survive and
every request that did not fail must equal its baseline) and ``sensitivity`` (the
same blocks corrupted *without* being reported: outputs should now differ, which
shows the comparison would catch a failure that recovery missed).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from engine_patches.connectors.injection import InjectionPlan, SpecError, prefix_key, prefix_len
from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding, verdict

POLICIES = ("recompute", "fail")
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "attention", "global", "local"}
BLOCK_SIZE = 32  # the diag runs the engine with --block-size 32 (CPU kernels want multiples of 32)
PHASES = ("store", "roundtrip", "inject", "sensitivity")

_RECOVERED = re.compile(
    r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)"
)
_FAILING = re.compile(
    r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=fail, (\d+) tokens affected\)"
)
_DEATH = (
    "EngineDeadError",
    "EngineCore encountered a fatal error",
    "not supported for models with multiple KV cache groups",
    "too many values to unpack",
)


# ---- arguments --------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    policy: str = "recompute"
    rate: float | None = None
    blocks: str | None = None
    requests: int = 4
    seed: int = 0
    targets: int | None = None  # how many requests get injections (None: half, rounded up)
    max_tokens: int = 16
    no_patch: bool = False

    def validate(self) -> None:
        """Raise ValueError with one line for bad arguments."""
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.rate is not None and self.blocks is not None:
            raise ValueError("give either --rate or --blocks, not both")
        if self.rate is not None and not (0.0 <= self.rate <= 1.0 and math.isfinite(self.rate)):
            raise ValueError(f"--rate {self.rate} is outside 0..1")
        if not 1 <= self.requests <= 64:
            raise ValueError(f"--requests {self.requests} is outside 1..64")
        if self.targets is not None and not 0 <= self.targets <= self.requests:
            raise ValueError(f"--targets {self.targets} is outside 0..{self.requests}")
        if not 1 <= self.max_tokens <= 128:
            raise ValueError(f"--max-tokens {self.max_tokens} is outside 1..128")
        try:
            self.plan(())
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @property
    def mode(self) -> str:
        return "rate" if self.rate is not None else "blocks"

    def plan(
        self, target_keys: tuple[str, ...], epoch: str = "inject", *, silent: bool = False
    ) -> InjectionPlan:
        if self.rate is not None:
            return InjectionPlan(
                rate=self.rate, seed=self.seed, requests=target_keys, epoch=epoch, silent=silent
            )
        return InjectionPlan(
            blocks=self.blocks or "-1",
            seed=self.seed,
            requests=target_keys,
            epoch=epoch,
            silent=silent,
        )


def servable(config: dict) -> str | None:
    """Why the connector cannot serve a model (None: it can). The connector moves
    attention KV blocks of decoder models; recurrent state (Mamba, linear attention),
    encoders and multimodal towers are out of its reach."""
    archs = " ".join(config.get("architectures") or [])
    if not archs:
        return "config.json names no architecture"
    if "CausalLM" not in archs:
        return (
            f"architecture {archs} is not a decoder (the connector moves decoder attention KV only)"
        )
    text = str(config.get("model_type", "")) + " " + archs
    if any(
        w in text.lower()
        for w in ("mamba", "jamba", "bamba", "granitemoehybrid", "nemotron_h", "qwen3_next")
    ):
        return f"architecture {archs} keeps recurrent (Mamba) state the connector cannot store"
    kinds = set(config.get("layer_types") or [])
    other = kinds - ATTENTION_LAYER_TYPES
    if other:
        return f"layer types {sorted(other)} are not attention layers the connector can store"
    return None


# ---- workload ---------------------------------------------------------------------
def make_prompts(
    n: int, seed: int, vocab_size: int, *, block_size: int = BLOCK_SIZE, max_len: int = 160
) -> list[list[int]]:
    """N token-id prompts of 2-4 whole blocks plus a tail, distinct, reproducible.
    Token ids avoid the first four (special tokens of the embedded tokenizer)."""
    rng = random.Random(seed)
    lo, hi = 4, max(5, vocab_size - 1)
    prompts: list[list[int]] = []
    keys: set[str] = set()
    while len(prompts) < n:
        blocks = rng.randint(2, 4)
        length = min(max_len, blocks * block_size + rng.randint(2, block_size - 1))
        p = [rng.randint(lo, hi) for _ in range(length)]
        k = prefix_key(p[: prefix_len(len(p), block_size)])
        if k not in keys:
            keys.add(k)
            prompts.append(p)
    return prompts


def choose_targets(n: int, seed: int, k: int | None) -> list[int]:
    """Indices of the requests that get injections (sorted)."""
    k = math.ceil(n / 2) if k is None else k
    return sorted(random.Random(seed + 7919).sample(range(n), k))


def keys_of(prompts: list[list[int]], block_size: int = BLOCK_SIZE) -> list[str]:
    return [prefix_key(p[: prefix_len(len(p), block_size)]) for p in prompts]


# ---- outputs ----------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    ok: bool  # an HTTP 200 with a choice
    finish_reason: str | None = None
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    error: str | None = None

    @property
    def failed(self) -> bool:
        return not self.ok or self.finish_reason == "error"

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "finish_reason": self.finish_reason,
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "error": self.error,
        }


def output_from_response(status: int, body: Any) -> Output:
    if status != 200 or not isinstance(body, dict):
        msg = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        return Output(False, error=f"HTTP {status}: {str(msg)[:200]}")
    try:
        choice = body["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        ids = tuple(
            int(t.split(":", 1)[1]) if isinstance(t, str) and t.startswith("token_id:") else -1
            for t in tokens
        )
        logprobs = tuple(float(x) for x in (lp.get("token_logprobs") or []))
        return Output(True, choice.get("finish_reason"), ids, logprobs)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return Output(False, error=f"malformed completion: {exc!r}")


@dataclass(frozen=True)
class Comparison:
    tokens_equal: bool
    logprobs_equal: bool
    max_logprob_diff: float | None
    first_divergence: int | None

    @property
    def identical(self) -> bool:
        return self.tokens_equal and self.logprobs_equal


def compare(base: Output, other: Output) -> Comparison:
    if not base.ok or not other.ok:
        return Comparison(False, False, None, 0)
    tokens_equal = base.token_ids == other.token_ids and bool(base.token_ids)
    first = None
    for i, (a, b) in enumerate(zip(base.token_ids, other.token_ids, strict=False)):
        if a != b:
            first = i
            break
    if first is None and len(base.token_ids) != len(other.token_ids):
        first = min(len(base.token_ids), len(other.token_ids))
    diffs = [abs(a - b) for a, b in zip(base.logprobs, other.logprobs, strict=False)]
    logprobs_equal = base.logprobs == other.logprobs and len(base.logprobs) == len(base.token_ids)
    return Comparison(tokens_equal, logprobs_equal, max(diffs) if diffs else None, first)


# ---- engine accounting ---------------------------------------------------------------
@dataclass(frozen=True)
class Accounting:
    rescheduled_requests: int = 0
    recomputed_tokens: int = 0
    failed_requests: int = 0
    failed_tokens: int = 0
    lines: tuple[str, ...] = ()


def account(log_segment: str) -> Accounting:
    """Sum vLLM's own recovery lines ("N request(s) rescheduled (M tokens affected)",
    "Failing N request(s) ... M tokens affected") in a slice of the server log."""
    rr = rt = fr = ft = 0
    lines = []
    for line in log_segment.splitlines():
        m = _RECOVERED.search(line)
        if m:
            rr, rt = rr + int(m.group(1)), rt + int(m.group(2))
            lines.append(line.strip()[-160:])
            continue
        m = _FAILING.search(line)
        if m:
            fr, ft = fr + int(m.group(1)), ft + int(m.group(2))
            lines.append(line.strip()[-160:])
    return Accounting(rr, rt, fr, ft, tuple(lines))


def death_lines(log_segment: str, limit: int = 3) -> list[str]:
    out = []
    for line in log_segment.splitlines():
        if any(m in line for m in _DEATH):
            text = line.strip()
            if text not in out:
                out.append(text[-240:])
    return out[-limit:]


# ---- report -------------------------------------------------------------------------
@dataclass
class RequestRow:
    index: int
    prompt_tokens: int
    targeted: bool
    injected_blocks: int = 0
    recomputed_tokens: int = 0  # from the patch's per-request events (multi-group)
    roundtrip: Comparison | None = None
    inject: Comparison | None = None
    inject_output: Output | None = None
    sensitivity: Comparison | None = None

    @property
    def failed(self) -> bool:
        return bool(self.inject_output and self.inject_output.failed)

    def to_dict(self) -> dict:
        def cmp(c: Comparison | None) -> dict | None:
            if c is None:
                return None
            return {
                "identical": c.identical,
                "tokens_equal": c.tokens_equal,
                "logprobs_equal": c.logprobs_equal,
                "max_logprob_diff": c.max_logprob_diff,
                "first_divergence": c.first_divergence,
            }

        return {
            "index": self.index,
            "prompt_tokens": self.prompt_tokens,
            "targeted": self.targeted,
            "injected_blocks": self.injected_blocks,
            "failed": self.failed,
            "finish_reason": self.inject_output.finish_reason if self.inject_output else None,
            "error": self.inject_output.error if self.inject_output else None,
            "roundtrip": cmp(self.roundtrip),
            "inject": cmp(self.inject),
            "sensitivity": cmp(self.sensitivity),
        }


@dataclass
class Facts:
    """What the diag observed (filled by the command, judged here)."""

    settings: Settings
    groups: int | None
    policy_seen: str | None
    patch_status: str | None
    rows: list[RequestRow] = field(default_factory=list)
    roundtrip_loads: int = 0
    injections: int = 0
    accounting: Accounting = field(default_factory=Accounting)
    engine_alive: bool = True
    died_in: str | None = None
    death: list[str] = field(default_factory=list)
    sensitivity_ran: bool = False
    metrics: dict[str, float] = field(default_factory=dict)  # /metrics deltas over the inject phase


def judge(f: Facts) -> list[Finding]:
    s = f.settings
    out: list[Finding] = []
    n = len(f.rows)
    if f.died_in:
        why = f" ({f.death[-1]})" if f.death else ""
        hint = "" if not s.no_patch else " -- this is what the kv_hybrid_recompute patch prevents"
        out.append(
            Finding(
                FAIL, "kv_fail.engine_died", f"engine died during the {f.died_in} phase{why}{hint}"
            )
        )
    else:
        out.append(Finding(OK, "kv_fail.engine_alive", "engine alive after every phase"))
    rt = [r for r in f.rows if r.roundtrip is not None]
    if rt:
        bad = [r.index for r in rt if not r.roundtrip or not r.roundtrip.identical]
        if bad:
            out.append(
                Finding(
                    FAIL,
                    "kv_fail.roundtrip_mismatch",
                    f"store/reload without injection changed outputs of request(s) {bad}",
                )
            )
        elif f.roundtrip_loads < n:
            out.append(
                Finding(
                    FAIL,
                    "kv_fail.roundtrip_not_loaded",
                    f"only {f.roundtrip_loads}/{n} requests reloaded KV from the connector",
                )
            )
        else:
            out.append(
                Finding(
                    OK,
                    "kv_fail.roundtrip_identical",
                    f"{n}/{n} requests reloaded their KV (every group) and matched the baseline",
                )
            )
    if f.died_in in (None, "sensitivity"):
        if f.injections == 0:
            out.append(
                Finding(
                    WARNING, "kv_fail.nothing_injected", "no block was injected; nothing was proven"
                )
            )
        failed = [r.index for r in f.rows if r.failed]
        innocent = [r.index for r in f.rows if r.failed and r.injected_blocks == 0]
        mism = [
            r.index
            for r in f.rows
            if not r.failed and r.inject is not None and not r.inject.identical
        ]
        if mism:
            out.append(
                Finding(
                    FAIL,
                    "kv_fail.output_mismatch",
                    f"request(s) {mism} finished but differ from the baseline after injection",
                )
            )
        if s.policy == "recompute" and failed:
            out.append(
                Finding(
                    FAIL,
                    "kv_fail.failed_under_recompute",
                    f"request(s) {failed} failed although the policy is recompute",
                )
            )
        if s.policy == "fail" and innocent:
            out.append(
                Finding(
                    FAIL,
                    "kv_fail.innocent_failed",
                    f"request(s) {innocent} failed without any injected block",
                )
            )
        if s.policy == "fail":
            hit = [r.index for r in f.rows if r.injected_blocks and not r.failed]
            if hit:
                out.append(
                    Finding(
                        WARNING,
                        "kv_fail.injected_not_failed",
                        f"request(s) {hit} had injected blocks but did not fail",
                    )
                )
        if not mism and f.injections:
            survivors = sum(1 for r in f.rows if not r.failed)
            out.append(
                Finding(
                    OK,
                    "kv_fail.outputs_identical",
                    f"{survivors}/{n} non-failed requests equal their baseline (tokens and logprobs)",
                )
            )
        if f.accounting.recomputed_tokens or f.accounting.failed_requests:
            a = f.accounting
            out.append(
                Finding(
                    INFO,
                    "kv_fail.engine_accounting",
                    f"engine: {a.rescheduled_requests} request(s) rescheduled, {a.recomputed_tokens} "
                    f"tokens recomputed; {a.failed_requests} request(s) failed",
                )
            )
    if f.sensitivity_ran:
        changed = [
            r.index for r in f.rows if r.sensitivity is not None and not r.sensitivity.identical
        ]
        if changed:
            out.append(
                Finding(
                    OK,
                    "kv_fail.sensitive",
                    f"silently corrupting the same blocks changed request(s) {changed}: "
                    "the comparison catches a missed recovery",
                )
            )
        else:
            out.append(
                Finding(
                    WARNING,
                    "kv_fail.insensitive",
                    "silently corrupting the injected blocks changed no output; "
                    "identical outputs prove less than they seem",
                )
            )
    return out


def summary(f: Facts) -> dict:
    a = f.accounting
    affected = sum(1 for r in f.rows if r.injected_blocks)
    findings = judge(f)
    identical = (
        all(r.inject.identical for r in f.rows if not r.failed and r.inject is not None)
        and not f.died_in
    )
    return {
        "failures_injected": f.injections,
        "requests_affected": affected,
        "tokens_recomputed": a.recomputed_tokens,
        "tokens_recomputed_source": "engine log (vLLM's 'tokens affected' lines)",
        "requests_rescheduled": a.rescheduled_requests,
        "requests_failed": sum(1 for r in f.rows if r.failed),
        "engine_alive": f.engine_alive and not f.died_in,
        "outputs_identical": identical,
        "findings": [x.to_dict() for x in findings],
        "verdict": verdict(findings),
    }
