"""shutdown: nothing left once certify's engines stopped (the check's declaration).

The whole check is this folder, one file per role: ``judge.py`` (pure: the findings),
``collect.py`` (the recheck: processes still running, files in /dev/shm), ``run.py`` (the
library call certify makes over its session's stop reports). certify runs it after every
engine stopped, so it opens no engine of its own.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Subject


def _applies(s: Subject) -> str | None:
    return None if s.managed else "opsctl did not start this server, so it does not stop it"


CHECK = Check(
    "shutdown",
    "shutdown hygiene: 0 processes, 0 /dev/shm segments left",
    "After the engines stop: no process and no /dev/shm segment left.",
    order=90,
    certify=_applies,
    after_engines=True,
)
