"""mm-uuid: which multimodal identifier reached the engine core (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a
surface needs it): ``judge.py`` (pure: items matched to the engine's records, the
verdict), ``run.py`` (the library call for diag, certify and the console, its exit rule
and the engines certify starts for it), ``flags.py`` (``opsctl diag mm-uuid``'s flags),
``view.py`` (the text renderer). Its I/O is opsctl.collectors.mm_uuid (its image data
URLs serve invariance and lora too); ``opsctl.checks.mm_uuid`` re-exports run.py under
the name the README documents.
"""

from __future__ import annotations

from opsctl.domain.check_registry import MULTIMODAL, Check, Offer, Subject, kind_name


def _applies(s: Subject) -> str | None:
    if not s.multimodal:
        return f"{kind_name(s)} model: no multimodal items to identify"
    return None if s.managed else s.mm_probe


CHECK = Check(
    "mm-uuid",
    "multimodal UUIDs kept by the engine",
    "Which multimodal identifier reached the engine core.",
    order=60,
    certify=_applies,
    offer=Offer(MULTIMODAL, "multimodal UUIDs (needs the mm_uuid probe)"),
    examples=(
        "opsctl diag mm-uuid",
        "opsctl diag mm-uuid --mode caches-on --json",
        "opsctl diag mm-uuid 127.0.0.1:8000 --run 20260101-000000-serve-tiny-vlm-multi-8000",
    ),
)
