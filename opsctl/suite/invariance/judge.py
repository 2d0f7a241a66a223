"""Batch invariance: compare each prompt run alone (BS=1) with it run in a batch (BS=N).

Token by token and logprob by logprob. Pure: no I/O, no UI.

Contract (vLLM PR 56528, and what `opsctl diag invariance` reports):
- Comparison is bitwise by default (``atol=None``: float equality); with ``atol`` a
  logprob difference up to ``atol`` counts as matching and the report says so.
- Fail closed: a request error, a missing output, fewer tokens than asked, a missing
  sampled logprob or fewer top logprobs than asked is a failure with its reason, never a
  pass and never a skip.
- Per prompt: ``identical`` (bitwise), ``within_atol``, ``diverged`` (first divergence
  and largest difference) or ``error`` (the fail-closed reason).

The engine side (isolating settings read back, the batch that formed, the run's own
failures and warnings) is in :mod:`opsctl.suite.invariance.judge_engine`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from opsctl.domain.generation import Generated, TokenKey
from opsctl.domain.records import record

IDENTICAL, WITHIN_ATOL, DIVERGED, ERROR = "identical", "within_atol", "diverged", "error"
PASSING = (IDENTICAL, WITHIN_ATOL)


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a prompt's batched run first left its run alone: position, kind, tokens, logprobs."""

    position: int
    kind: str  # token | logprob | top_logprobs
    token_alone: TokenKey | None
    token_batched: TokenKey | None
    logprob_alone: float | None
    logprob_batched: float | None
    diff: float | None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The divergence as the report holds it (every field, by its name)."""
        return record(self)


@dataclass(frozen=True, slots=True)
class PromptResult:
    """One prompt's comparison: its status, first divergence and largest logprob difference."""

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
        """True when the prompt is identical or within atol."""
        return self.status in PASSING

    def to_dict(self) -> dict[str, Any]:
        """The prompt's result as the report holds it (its first divergence nested)."""
        return record(self)


@dataclass(frozen=True, slots=True)
class Summary:
    """The run's verdict and counts of prompts per status."""

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
        """The summary as the report holds it (the reasons as a list)."""
        return record(self)


def comparison_label(atol: float | None) -> str:
    """How outputs are compared: ``bitwise`` or ``atol=<value>``."""
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


# ---- text of a result (the live table, the report's tables, the CLI's failure line) ----


def fmt_diff(d: float | None) -> str:
    """A logprob difference for a table cell: ``-``, ``0`` or three significant digits."""
    return "-" if d is None else ("0" if d == 0 else f"{d:.3g}")


def preview(text: str, n: int = 28) -> str:
    """A prompt on one short line."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def divergence_text(r: PromptResult) -> str:
    """Where and how one prompt diverged, for a table cell.

    Where and how one prompt diverged (its fail-closed reason for an error, "-" when
    it matched).
    """
    d = r.first_divergence
    if d is None:
        return r.reason or "-"
    return (
        f"pos {d.position} {d.kind}: tok {d.token_alone}/{d.token_batched} "
        f"lp {d.logprob_alone!r}/{d.logprob_batched!r} Δ {fmt_diff(d.diff)}"
    )
