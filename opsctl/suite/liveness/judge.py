"""liveness, pure: /health, one request and the engine's token counter into findings.

What :mod:`opsctl.suite.liveness.collect` read (plain values) in, findings out; the verdict
from them is :func:`opsctl.checks.findings_report.verdict_of`.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsctl.domain.findings import FAIL, OK, WARNING, Finding
from opsctl.domain.metrics import GEN_TOKENS, PROMPT_TOKENS

# the counter that must advance: generation for a generative model, prompt for a pooling one
GEN_COUNTER, PROMPT_COUNTER = GEN_TOKENS, PROMPT_TOKENS


@dataclass(frozen=True, slots=True)
class Liveness:
    """What the liveness check measured on one server."""

    health_status: int | None
    health_error: str | None
    endpoint: str  # /v1/completions, /score, /v1/embeddings
    request_status: int | None
    request_error: str | None
    tokens: int | None  # generated (or prompt, for pooling) tokens the answer reports
    counter: str  # the /metrics counter that must advance
    before: float | None  # None: /metrics unreadable
    after: float | None
    waited: float  # seconds waited for the counter to advance


def liveness_findings(m: Liveness) -> list[Finding]:
    """Findings of the liveness check: /health, one request, and the engine's progress."""
    out: list[Finding] = []
    if m.health_status != 200:
        got = f"HTTP {m.health_status}" if m.health_status is not None else m.health_error
        out.append(Finding(FAIL, "liveness.health", f"/health did not answer 200 ({got})"))
    if m.request_status != 200 or m.request_error:
        got = f"HTTP {m.request_status}" if m.request_status is not None else "no answer"
        why = f": {m.request_error}" if m.request_error else ""
        out.append(
            Finding(FAIL, "liveness.request", f"one {m.endpoint} request failed ({got}){why}")
        )
    if m.before is None or m.after is None:
        out.append(
            Finding(
                WARNING,
                "liveness.unverified",
                f"/metrics has no {m.counter}: forward progress could not be verified",
            )
        )
        return out
    delta = m.after - m.before
    if delta >= 1:
        out.append(
            Finding(
                OK,
                "liveness.progress",
                f"{m.counter} advanced by {delta:g} ({m.before:g} -> {m.after:g})",
                {"before": m.before, "after": m.after},
            )
        )
    elif m.request_status == 200:
        out.append(
            Finding(
                FAIL,
                "liveness.no_progress",
                f"{m.counter} did not advance within {m.waited:.0f} s of a successful "
                f"{m.endpoint} request ({m.before:g} -> {m.after:g}): the server answers but "
                "the engine shows no forward progress",
                {"before": m.before, "after": m.after},
            )
        )
    return out
