"""mm-uuid: which multimodal identifier reached the engine core (the check's declaration).

Its code: the run opsctl.checks.mm_uuid, its flags opsctl.commands.diag.mm_uuid, its
judgement opsctl.domain.mm_uuid, its I/O opsctl.collectors.mm_uuid, its renderer
opsctl.ui.render_mm_uuid.
"""

from __future__ import annotations

from opsctl.domain.check_registry import MULTIMODAL, Check, Offer, Parts, Subject, kind_name


def _flags():
    from opsctl.commands.diag.mm_uuid import mm_uuid

    return mm_uuid


def _load() -> Parts:
    from opsctl.checks import mm_uuid
    from opsctl.ui.render_mm_uuid import render

    return Parts.of(mm_uuid, render=render)


def _applies(s: Subject) -> str | None:
    if not s.multimodal:
        return f"{kind_name(s)} model: no multimodal items to identify"
    return None if s.managed else s.mm_probe


CHECK = Check(
    "mm-uuid",
    "multimodal UUIDs kept by the engine",
    "Which multimodal identifier reached the engine core.",
    order=60,
    load=_load,
    flags=_flags,
    certify=_applies,
    offer=Offer(MULTIMODAL, "multimodal UUIDs (needs the mm_uuid probe)"),
    examples=(
        "opsctl diag mm-uuid",
        "opsctl diag mm-uuid --mode caches-on --json",
        "opsctl diag mm-uuid 127.0.0.1:8000 --run 20260101-000000-serve-tiny-vlm-multi-8000",
    ),
)
