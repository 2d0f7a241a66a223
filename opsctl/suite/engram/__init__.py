"""engram: Engram tables after the run, orphans, fill and /dev/shm (the check's declaration).

Its code: opsctl.checks.hygiene (``certify_engram``), which reads /dev/shm and /proc on
this node (opsctl.collectors.engram).
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Parts, Subject


def _load() -> Parts:
    from opsctl.checks import hygiene

    return Parts.of(hygiene, certify=hygiene.certify_engram)


def _applies(s: Subject) -> str | None:
    if s.local:
        return None
    return "the server is not on this node: its /dev/shm and /proc are out of reach"


CHECK = Check(
    "engram",
    "Engram hygiene: no orphans, fill verified, /dev/shm capacity",
    "Engram tables: no orphans, fill verified, /dev/shm capacity.",
    order=30,
    load=_load,
    certify=_applies,
)
