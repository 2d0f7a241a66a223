"""Stacks of a stalled endpoint for the console (issue 35 item 2).

Taken once when an endpoint is judged stalled (not every tick: a new stall takes them
again), or on demand (the action key), each in a thread of its own so the UI never
waits. Local endpoints only (a process of this host: its pid, run directory or a URL a
local process serves); a remote endpoint's row says why there are none.

``StallStacks.observe(views)`` on every tick; ``take_now(view)`` for the key;
``lines(url)`` for the drill-in: when and why they were taken, the one-line verdict
(opsctl.stacks.judge_verdict: the stuck rank and the frame the others wait in) and one
line per process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from opsctl.console.judge import STALLED, EndpointView

AT_STALL = "at the stall"
ON_DEMAND = "on demand"


@dataclass(frozen=True, slots=True)
class Taken:
    """One taking of an endpoint's stacks: running or done, verdicts, headline, error.

    One taking: ``done`` False while it runs; ``processes`` the per-process verdicts,
    ``headline`` the one-line verdict, ``error`` why there are none."""

    url: str
    why: str  # AT_STALL | ON_DEMAND
    started_at: float
    done: bool = False
    seconds: float | None = None
    headline: str | None = None
    processes: tuple[str, ...] = ()
    error: str | None = None


def target_of(view: EndpointView) -> str | None:
    """What opsctl.stacks.run resolves for this endpoint; None for a remote one.

    Its pid, else its run directory, else a local URL."""
    from opsctl.domain.urls import loopback_port

    t = view.target
    if t.pid:
        return str(t.pid)
    if t.run_dir:
        return str(t.run_dir)
    if view.local is not None and view.local.procs:
        return str(view.local.procs[0].pid)
    return t.url if loopback_port(t.url) is not None else None


def take_stacks(target: str) -> tuple[str | None, tuple[str, ...], str | None]:
    """(headline, per-process lines, error) of the stacks of ``target``.

    The library call of ``opsctl stacks``."""
    from opsctl.errors import OpsctlError
    from opsctl.stacks import run as check

    try:
        report = check.run(target, check.Options(timeout=5.0))
    except OpsctlError as exc:
        return None, (), str(exc)
    doc = report.document
    lines = tuple(p["verdict"] for p in doc.get("processes") or [])
    return f"{doc['verdict']}: {doc['headline']}", lines, None


class StallStacks:
    """The stacks the console took, per endpoint URL (thread-safe)."""

    def __init__(
        self,
        take: Callable[[str], tuple[str | None, tuple[str, ...], str | None]] = take_stacks,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._take = take
        self._clock = clock
        self._lock = threading.Lock()
        self._taken: dict[str, Taken] = {}
        self._stalls: set[str] = set()  # endpoints in a stall whose stacks were taken

    def observe(self, views: Iterable[EndpointView]) -> None:
        """Take the stacks of each local endpoint that has just become stalled."""
        for v in views:
            url = v.target.url
            if v.state != STALLED:
                self._stalls.discard(url)
                continue
            if url in self._stalls:
                continue
            target = target_of(v)
            if target is None:
                continue  # another host's: nothing to take automatically
            self._stalls.add(url)
            self._start(url, target, AT_STALL)

    def take_now(self, view: EndpointView) -> str | None:
        """Take them now for ``view``; the reason when they cannot be taken."""
        target = target_of(view)
        if target is None:
            return f"stacks are local only: {view.target.url} is another host's"
        with self._lock:
            running = self._taken.get(view.target.url)
            if running is not None and not running.done:
                return "stacks are being taken already"
        self._start(view.target.url, target, ON_DEMAND)
        return None

    def get(self, url: str) -> Taken | None:
        """The latest taking of the endpoint at ``url``; None if none."""
        with self._lock:
            return self._taken.get(url)

    def _start(self, url: str, target: str, why: str) -> None:
        taken = Taken(url, why, self._clock())
        with self._lock:
            self._taken[url] = taken

        def work() -> None:
            t0 = time.monotonic()
            try:
                headline, lines, error = self._take(target)
            except Exception as exc:  # shown on the row's drill-in, never raised in the UI
                headline, lines, error = None, (), f"{type(exc).__name__}: {exc}"
            done = replace(
                taken,
                done=True,
                seconds=round(time.monotonic() - t0, 2),
                headline=headline,
                processes=lines,
                error=error,
            )
            with self._lock:
                if self._taken.get(url) is taken:
                    self._taken[url] = done

        threading.Thread(target=work, name=f"stacks {url}", daemon=True).start()

    def lines(self, url: str) -> list[str]:
        """The drill-in's stacks block (plain text; empty when none were taken)."""
        t = self.get(url)
        if t is None:
            return []
        when = time.strftime("%H:%M:%S", time.localtime(t.started_at))
        if not t.done:
            return [f"stacks: being taken ({t.why}, {when})"]
        head = f"stacks taken {t.why} ({when}, {t.seconds:.1f} s)"
        if t.error:
            return [f"{head}: {t.error}"]
        return [f"{head}: {t.headline or 'nothing read'}", *(f"  {p}" for p in t.processes)]
