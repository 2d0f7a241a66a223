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

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import psutil

from tests.waiting import wait_until


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
        """Let ``pids`` (stopped cores) run for about ``seconds`` (resume, sleep and stop in
        a child shell). About: under a CPU hog a 20 ms slice took 4.2 s done in-process
        and 12.35 s from the shell (3.5 s with the cores at nice 19) -- the slicing
        process itself is starved while a core runs, so callers give the cores more work
        than an overrun can finish (ClosedLoad) and slice only the cores that need it."""
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
        t0 = wait_until(
            lambda t0=t0: (t := last_ok()) is not None and t > t0 and t,
            max(0.0, deadline - time.monotonic()),
            f"a fresh scrape of {what}",
        )


def cpu_used(procs: list[psutil.Process], window: float = 1.0) -> list[float]:
    """CPU seconds (user + system) each process used over ``window`` s."""

    def cpu() -> list[float]:
        return [sum(p.cpu_times()[:2]) for p in procs]

    before = cpu()
    time.sleep(window)  # the measurement window itself
    return [b - a for a, b in zip(before, cpu(), strict=True)]


def idle_thresholds(pids: list[int], windows: int = 3, floor: float = 0.05) -> list[float]:
    """Per process, the CPU per 1 s window above which it counts as busy: twice what it used
    at most over ``windows`` windows now (an idle API server still answers the sources'
    /metrics scrapes: 0.06-0.07 s a second on idle cores, fc11), at least ``floor``."""
    procs = [psutil.Process(p) for p in pids]
    worst = [max(col) for col in zip(*(cpu_used(procs) for _ in range(windows)), strict=True)]
    return [max(floor, 2 * w) for w in worst]


def wait_idle(pids: list[int], timeout: float, busy: list[float]) -> None:
    """Wait until each process used under its ``busy`` s of CPU over one 1 s window: with
    the cores stopped, an API server that went idle has admitted every request it was sent
    and handed it to its core (none left for it to trickle in during the slices)."""
    procs = [psutil.Process(p) for p in pids]
    deadline = time.monotonic() + timeout
    while True:
        used = cpu_used(procs)
        if all(u < b for u, b in zip(used, busy, strict=True)):
            return
        assert time.monotonic() < deadline, (
            f"processes {pids} still busy after {timeout:.0f} s: used {used}, idle below {busy}"
        )


class ClosedLoad:
    """``clients`` closed-loop clients per server, each sending the next completion as
    soon as its last one answered, until stop(): the engines never run out of work,
    so a slice that overruns by seconds (measured: 3.5 and 12 s under a CPU hog, the
    slicing shell starved while a core ran) still leaves requests to freeze. One thread,
    one event loop; ``done`` counts answers per URL, ``failed`` keeps every HTTP error."""

    def __init__(self, urls: list[str], clients: int, body: dict) -> None:
        self.urls, self.clients, self.body = urls, clients, body
        self.done = dict.fromkeys(urls, 0)
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _client(self, client, url: str) -> None:
        while not self._stop.is_set():
            try:
                r = await client.post(f"{url}/v1/completions", json=self.body)
                r.raise_for_status()
                self.done[url] += 1
            except httpx.HTTPError as exc:
                self.failed.append(repr(exc))
                return

    async def _main(self) -> None:
        # a new connection per request: a client starved for over 5 s (uvicorn's keep-alive
        # timeout in vLLM) wrote its next request on a connection the server had just
        # closed and got ReadError('') (fresh clone under a CPU hog)
        n = len(self.urls) * self.clients + 2
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await asyncio.gather(
                *(self._client(client, u) for u in self.urls for _ in range(self.clients))
            )

    def start(self) -> ClosedLoad:
        self._thread.start()
        return self

    def halt(self) -> None:
        """No new requests (the ones in flight still answer)."""
        self._stop.set()

    def stop(self, timeout: float) -> None:
        """No new requests; wait (deadline) for the ones in flight to answer."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"requests still in flight after {timeout:.0f} s"
