"""invariance: BS=1 vs BS=N batch invariance of tokens and logprobs (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a surface
needs it): ``judge.py`` (pure: the BS=1 vs BS=N comparison), ``judge_engine.py``
(the engine's settings, batches and warnings read back), ``judge_calibration.py`` (the
calibrated noise floor, which lora shares), ``judge_images.py`` (the images a
vision-language run sends), ``collect_images.py`` (chat requests with images),
``run.py`` and ``run_images.py`` (the library call for diag, certify and the console,
its engines and exit rule), ``flags.py`` (``opsctl diag invariance``'s flags),
``view.py`` (the text renderer). Its text requests are opsctl.collectors.completions,
which other checks share; ``opsctl.checks.invariance`` re-exports run.py under the name
docs/python.md documents. Under certify the engine the checks share is its isolated
engine (``run.shared_engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opsctl.domain.check_registry import GENERATIVE, Check, Offer, Subject, kind_name
from opsctl.domain.findings import FAIL, WARNING, Finding


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
