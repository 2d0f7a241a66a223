"""shutdown: nothing left once certify's engines stopped (the check's declaration).

Its code: opsctl.checks.hygiene (``certify_shutdown``) over the session's stop reports.
certify runs it after every engine stopped, so it opens no engine of its own.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Parts, Subject


def _load() -> Parts:
    from opsctl.checks import hygiene

    return Parts.of(hygiene, certify=hygiene.certify_shutdown)


def _applies(s: Subject) -> str | None:
    return None if s.managed else "opsctl did not start this server, so it does not stop it"


CHECK = Check(
    "shutdown",
    "shutdown hygiene: 0 processes, 0 /dev/shm segments left",
    "After the engines stop: no process and no /dev/shm segment left.",
    order=90,
    load=_load,
    certify=_applies,
    after_engines=True,
)
