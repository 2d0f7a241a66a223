"""Freezing real EngineCores with requests in them, the same way on an idle and on a
loaded machine.

Freezing a core "mid-load" with SIGSTOP at a moment chosen by watching /metrics is a
race on a busy 2-core machine: tiny-llama on CPU steps far faster than the API server
drains outputs, the API server's loop then starves /metrics (scrapes of 8-14 s measured
under a CPU hog) and admissions, and the freeze lands when the core has finished what it
had (measured: a burst of 48 x 480 tokens ran to the end without one scrape reading a
request running). So the cores are stopped *before* the load: the API servers admit
every request with nothing to drain, then the cores run in short slices until the
scrapes read the wanted state (requests running, or running and waiting), and then
they stay stopped. Only the cores that have not reached it are sliced, and a slice that
made no visible progress is doubled (up to 0.5 s): on a loaded machine a 20 ms slice can
give a stopped core almost no CPU time, or overrun by seconds (4.2 s measured)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable


class Cores:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.stopped = False
        self.slices: list[float] = []  # the slices given, in seconds

    def _signal(self, sig: int, pids: list[int] | None = None) -> None:
        for pid in self.pids if pids is None else pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        self._signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.stopped = False

    def slice(self, seconds: float, pids: list[int]) -> None:
        """Let ``pids`` (stopped cores) run for about ``seconds``. The resume, the sleep
        and the stop happen in a child shell, not in this process: here a slice once took
        4.2 s instead of 20 ms under a CPU hog (this process's other threads, the console
        sources and the load, hold its interpreter lock), and a core ran every request to
        the end inside it. Callers slice only the cores that still need it."""
        ids = " ".join(map(str, pids))
        script = (
            f"kill -CONT {ids} 2>/dev/null; sleep {seconds}; kill -STOP {ids} 2>/dev/null; true"
        )
        subprocess.run(["/bin/sh", "-c", script], check=True, timeout=120)
        self.slices.append(seconds)

    def run_until(
        self,
        pending: Callable[[], list[int]],
        observed: Callable[[], object],
        settle: Callable[[], None],
        *,
        timeout: float,
        show: Callable[[], object] = lambda: "",
    ) -> None:
        """Slice the stopped cores that ``pending()`` names until it names none;
        ``settle()`` waits (with its own deadline) until the scrapes caught up after a
        slice; a slice after which ``observed()`` did not change is doubled. The cores
        stay stopped on return."""
        assert self.stopped
        deadline = time.monotonic() + timeout
        seconds = 0.02
        before = observed()
        while todo := pending():
            assert time.monotonic() < deadline, (
                f"cores never reached the wanted state in {timeout:.0f} s "
                f"(slices {self.slices}): {show()}"
            )
            self.slice(seconds, todo)
            settle()
            now = observed()
            if now == before:
                seconds = min(0.5, 2 * seconds)
            before = now


def wait_fresh(last_ok: Callable[[], float | None], timeout: float, what: str) -> None:
    """Wait until one endpoint has a successful scrape that *started* after now: one
    finished after now, then the next one (an endpoint's scrapes run one after another,
    so that one started after the first finished). A scrape count is not enough: a busy
    API server's /metrics answers late, and counting other endpoints' or failed scrapes
    once let a core run every request to the end unseen."""
    t0 = time.time()
    deadline = time.monotonic() + timeout
    for _ in range(2):
        while (t := last_ok()) is None or t <= t0:
            assert time.monotonic() < deadline, f"no fresh scrape of {what} in {timeout:.0f} s"
            time.sleep(0.05)
        t0 = t
