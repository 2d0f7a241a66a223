"""invariance: BS=1 vs BS=N batch invariance of tokens and logprobs (the check's declaration).

Its code (not moved yet: docs/architecture.md walks through it where it is): the run
opsctl.checks.invariance, its flags opsctl.commands.diag.invariance, its judgement
opsctl.domain.invariance, its renderer opsctl.ui.render_invariance. Under certify the
engine the checks share is its isolated engine (opsctl.checks.invariance.shared_engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opsctl.domain.check_registry import GENERATIVE, Check, Offer, Parts, Subject, kind_name
from opsctl.domain.findings import FAIL, WARNING, Finding


def _flags():
    from opsctl.commands.diag.invariance import invariance

    return invariance


def _load() -> Parts:
    from opsctl.checks import invariance
    from opsctl.ui.render_invariance import render

    return Parts.of(invariance, report=invariance.InvarianceReport, render=render)


def _applies(s: Subject) -> str | None:
    if s.generative:
        return None
    return f"{kind_name(s)} model: batch invariance compares generated tokens"


def _excluded(s: Subject) -> str | None:
    if s.managed or not s.prefix_caching or not s.generative:
        return None
    return (
        "not applicable to this server's configuration: it runs with prefix caching on "
        "(vLLM's default), and batch invariance is judged with it off; "
        f"run it anyway with `opsctl certify --checks invariance URL`, or on an isolated "
        f"engine with `opsctl diag invariance --model {s.model or 'MODEL'}`"
    )


def _findings(doc: Mapping[str, Any]) -> tuple[Finding, ...]:
    """Its reasons and each run's warnings (no codes in the document): stable codes."""
    out = [Finding(FAIL, "invariance.divergence", str(r)) for r in doc.get("reasons") or ()]
    for run in doc.get("runs") or ():
        for w in run.get("warnings") or ():
            out.append(Finding(WARNING, "invariance.warning", f"[{run.get('mode')}] {w}"))
    return tuple(out)


CHECK = Check(
    "invariance",
    "batch invariance (BS=1 vs BS=N tokens and logprobs)",
    "BS=1 vs BS=N batch invariance of tokens and logprobs.",
    order=50,
    load=_load,
    flags=_flags,
    certify=_applies,
    excluded=_excluded,
    findings=_findings,
    offer=Offer(GENERATIVE, "BS=1 vs BS=N on the server as it is"),
    examples=(
        "opsctl diag invariance --model tiny-llama --mode eager",
        "opsctl diag invariance 127.0.0.1:8000 --prompts prompts.txt --json",
        "opsctl diag invariance --model tiny-vlm-multi --images 2 --atol 1e-4",
    ),
)
