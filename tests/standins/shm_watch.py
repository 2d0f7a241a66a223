"""The /dev/shm segments one process tree held, seen while it ran.

The /dev/shm segments one process tree held, seen while it ran: what a test may judge
after stopping its own engine, instead of diffing the machine's /dev/shm (another vLLM on
the machine may create or leave segments meanwhile; a fresh clone once failed on a
semaphore another suite's engine had left, ``sem.mp-_f2p3i2a``). The same attribution
`opsctl runs clean` uses: a segment is an engine's when its processes map it or hold it
open."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil

from opsctl.collectors import shm


class TreeShm:
    """The /dev/shm segments a process tree held while a ``with`` block ran.

    Scans the tree under ``root_pid`` every ``every_s`` seconds while in its ``with``
    block (and once more at its end); ``seen`` is every segment path it held, ``left()``
    those of them still linked in /dev/shm, ``members`` every pid the tree had."""

    def __init__(self, root_pid: int, every_s: float = 0.1) -> None:
        self.root = root_pid
        self.every_s = every_s
        self.seen: set[str] = set()
        self.members: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tree-shm", daemon=True)

    def pids(self) -> list[int]:
        """The root's pid and its descendants' (empty once the root is gone)."""
        try:
            root = psutil.Process(self.root)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return []

    def scan(self) -> None:
        """Add the segments the tree maps or holds open now to ``seen``."""
        pids = self.pids()
        self.members.update(pids)
        if pids:
            self.seen |= shm.scan_holders(pids).held_paths()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.scan()

    def __enter__(self) -> TreeShm:
        self.scan()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def names(self) -> set[str]:
        """The base names of every segment the tree held."""
        return {os.path.basename(p) for p in self.seen}

    def left(self) -> set[str]:
        """Segments the tree held that are still linked now."""
        return {os.path.basename(p) for p in self.seen if Path(p).exists()}
