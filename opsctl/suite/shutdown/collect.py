"""shutdown's recheck on this node: which processes still run, which /dev/shm files exist.

Read afresh after the engines stopped, beside each engine's own stop report; plain values
out."""

from __future__ import annotations

import contextlib

import psutil

from opsctl.collectors import shm
from opsctl.domain.runs import same_process


def shm_names() -> set[str]:
    """The names of the files now in /dev/shm."""
    return {f.name for f in shm.list_files()}


def still_alive(pids: dict[int, float]) -> list[int]:
    """Which of ``pids`` (pid -> create time) still run as the same process.

    A pid the kernel reused for another process does not count; zombies do not either."""
    out = []
    for pid, started in sorted(pids.items()):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p = psutil.Process(pid)
            if not same_process(started, p.create_time()):  # btime can move a second
                continue
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out
