"""DirectScrapeSource: scrapes every endpoint itself.

One asyncio task per endpoint, each with its own HTTP client (scrape.Poller: one kept
connection) and deadline, on one background event-loop thread: a hung endpoint ages only
its own row. Each task arms its next poll only after the previous one finished, so a
slow endpoint stretches its own period instead of piling up polls. Discovery of local
servers runs every few seconds (psutil, in an executor thread)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from opsctl.collectors import scrape as scrape_mod
from opsctl.console import discovery, targets
from opsctl.console.judge import DEAD, STARTING, UNREACHABLE, FleetSnapshot, Target
from opsctl.console.judge_state import EndpointTracker, Settings
from opsctl.console.source import EMPTY_HINT, LoopThreadSource

INFO_EVERY_S = 60.0  # /version, /v1/models, /server_info
ROLES_EVERY_S = 5.0  # process roles of local endpoints
DISCOVER_EVERY_S = 5.0


class _Endpoint:
    def __init__(self, target: Target, settings: Settings, api_key: str | None) -> None:
        self.target = target
        self.tracker = EndpointTracker(target, settings)
        self.api_key = api_key
        self.cache = scrape_mod.MetricsCache()
        self.roles_at = 0.0
        self.restarts_seen = 0
        self.task: asyncio.Task | None = None
        self.cores: dict[int, str] = {}  # the server's EngineCore pids seen -> their roles
        self.gone: str | None = None  # the first EngineCore seen gone while the server lived

    def want_info(self, now: float) -> bool:
        t = self.tracker
        fetched = t.info.fetched_at
        return fetched is None or now - fetched > INFO_EVERY_S or t.restarts != self.restarts_seen


class DirectScrapeSource(LoopThreadSource):
    """The fleet source that scrapes every endpoint itself (one task per endpoint)."""

    name = "direct"

    def __init__(
        self,
        static: list[Target],
        *,
        discover: bool = True,
        runs_root: Path | None = None,
        settings: Settings | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        discover_fn: Callable[[], list[Target]] | None = None,
        identify: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        # give local URLs their server's pid (stopped processes read stalled at once);
        # False: judge them by their scrapes alone, as a remote server
        self.identify = identify
        self.static = static
        self.discover_enabled = discover
        self.runs_root = runs_root
        self.discover_fn = discover_fn
        self.api_key = api_key
        # a scrape's timeout: two intervals, but at least 3 s (a loaded host's API server
        # answered /metrics in seconds here, and --once at --interval 0.3 read a healthy
        # stand-in as unreachable with 1 s) and at most 10 s; a slow endpoint never ages
        # the others (one task each)
        self.timeout = (
            timeout if timeout is not None else max(3.0, min(10.0, 2 * self.settings.interval_s))
        )
        self.endpoints: dict[str, _Endpoint] = {}
        self._init_loop("console-scrape")

    # ---- targets ---------------------------------------------------------------------------
    def _discover(self) -> list[Target]:
        if self.discover_fn is not None:
            return self.discover_fn()
        from opsctl.paths import runs_dir

        return discovery.discover(self.runs_root or runs_dir())

    def api_key_for(self, t: Target) -> str | None:
        """The API key sent to ``t`` (its api_key_env, else the console's --api-key)."""
        if t.api_key_env:
            return os.environ.get(t.api_key_env) or None
        return self.api_key

    def _sync_targets(self, found: list[Target]) -> list[_Endpoint]:
        """Add newly found endpoints (returned: they need a poll task); drop discovered
        ones that discovery no longer finds (a run stopped in order, a server that went
        away), so a stopped run is not shown as dead for ever. Endpoints given as
        arguments or in a targets file stay, whatever happens to them."""
        merged = targets.merge(self.static, found)
        keys = {t.key for t in merged}
        added = []
        with self.lock:
            gone = [ep for key, ep in self.endpoints.items() if key not in keys]
            for ep in gone:
                if ep.target.source in ("opsctl-run", "discovered"):
                    if ep.task is not None:
                        ep.task.cancel()
                    del self.endpoints[ep.target.key]
            for t in merged:
                ep = self.endpoints.get(t.key)
                if ep is None:
                    ep = _Endpoint(t, self.settings, self.api_key_for(t))
                    self.endpoints[t.key] = ep
                    added.append(ep)
                elif t.pid and t.pid != ep.target.pid:  # a new server on the same port
                    ep.target = t
                    ep.tracker.target = t
                    ep.cores, ep.gone = {}, None
        return added

    # ---- the loop --------------------------------------------------------------------------
    def _identify(self) -> None:
        """Given local URLs get their server's pid (stopped processes, roles), even with
        discovery off: identifying a target adds no other server."""
        from dataclasses import replace

        from opsctl.paths import runs_dir

        if self.discover_fn is not None or not self.identify:  # targets as given
            return
        found = discovery.local_targets(
            [t.url for t in self.static if t.pid is None], self.runs_root or runs_dir()
        )
        for i, t in enumerate(self.static):
            if t.pid is None and (local := found.get(t.url)) is not None:
                self.static[i] = replace(
                    t,
                    pid=local.pid,
                    pid_started=local.pid_started,
                    run_dir=t.run_dir or local.run_dir,
                )

    def start(self) -> None:
        """Identify local targets, discover servers, then start the loop's tasks."""
        self._identify()
        found = self._discover() if self.discover_enabled else []
        self._sync_targets(found)
        self._start_loop()

    async def _main(self) -> None:
        self._open_events()
        for ep in list(self.endpoints.values()):
            ep.task = asyncio.create_task(self._run(ep))
        while self.discover_enabled:
            await asyncio.sleep(DISCOVER_EVERY_S)
            await self.unpaused.wait()
            found = await asyncio.get_running_loop().run_in_executor(None, self._discover)
            for ep in self._sync_targets(found):
                ep.task = asyncio.create_task(self._run(ep))
        await asyncio.Event().wait()  # keep the endpoint tasks' parent alive

    async def _run(self, ep: _Endpoint) -> None:
        assert self.wake is not None and self.unpaused is not None
        async with scrape_mod.Poller(ep.target.url, ep.api_key, self.timeout) as poller:
            while True:
                await self.unpaused.wait()
                t0 = time.monotonic()
                await self._poll(ep, poller)
                delay = self.settings.interval_s - (time.monotonic() - t0)
                if delay > 0:  # asyncio.timeout, not wait_for: no task per wait
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self.wake.wait()

    async def _poll(self, ep: _Endpoint, poller: scrape_mod.Poller) -> None:
        now = time.time()
        t = ep.target
        roles = now - ep.roles_at >= ROLES_EVERY_S
        with_log = ep.tracker.view.state in (STARTING, DEAD, UNREACHABLE)
        local = discovery.local_state(t, with_roles=roles, with_log=with_log) if t.pid else None
        if roles and local is not None:
            ep.roles_at = now
        elif local is not None and ep.tracker.local is not None and not local.procs:
            local = _keep_roles(local, ep.tracker.local)
        local = _engine_cores(ep, local)
        want_info = ep.want_info(now)
        s = await poller.scrape(want_info=want_info, cache=ep.cache)
        with self.lock:
            ep.tracker.local = local
            ep.tracker.observe(s)
        if s.info is not None and s.info.fetched_at is not None:  # complete: else ask again
            ep.restarts_seen = ep.tracker.restarts

    # ---- the interface ---------------------------------------------------------------------
    def collect(self) -> FleetSnapshot:
        """The current FleetSnapshot: every endpoint tracker's view."""
        with self.lock:
            views = tuple(ep.tracker.view for ep in self.endpoints.values())
        hint = EMPTY_HINT if not views else None
        return FleetSnapshot(
            time.time(), views, self.settings.interval_s, self.name, self.paused, hint
        )

    def series(self, url: str, name: str) -> list[float]:
        """The bounded history of one figure of one endpoint ([] for an unknown URL)."""
        with self.lock:
            ep = self.endpoints.get(url)
            return ep.tracker.series(name) if ep else []

    def tracker(self, url: str) -> EndpointTracker | None:
        """The tracker of the endpoint at ``url``; None when not watched."""
        ep = self.endpoints.get(url)
        return ep.tracker if ep else None

    def wait_settled(self, timeout: float) -> bool:
        """Wait until every endpoint has scrapes enough for rates; False on the deadline.

        Rates need two scrapes; one that says it is not a live vLLM server is enough."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                eps = list(self.endpoints.values())
            if all(_settled(ep) for ep in eps):
                return True
            time.sleep(0.05)
        return False


def _settled(ep: _Endpoint) -> bool:
    t = ep.tracker
    if t.scrapes >= 2:
        return True
    return t.scrapes >= 1 and t.last_ok_at is None


def _engine_cores(ep: _Endpoint, local):
    """``local`` with an EngineCore that vanished while the API server lives as dead.

    When one EngineCore of a server dies (SIGKILL of EngineCore_DP1, an out-of-memory
    kill), vLLM 0.32 keeps /health 200 for about 5 s while it tears the rest down: the
    gauges cannot say it (a busy server would read busy). The EngineCores the roles read
    named are checked at every poll; one gone makes the endpoint dead, naming it, and
    the dead reason after the server went down still starts with it."""
    from dataclasses import replace

    from opsctl.collectors.processes import alive

    if local is None:
        return local
    if local.alive and ep.cores and ep.gone is None:  # before new roles drop a dead one
        missing = set(ep.cores) - set(alive(list(ep.cores)))
        if missing:
            who = ", ".join(f"{ep.cores[p]} (pid {p})" for p in sorted(missing))
            ep.gone = (
                f"{who} gone (killed or exited) while the API server (pid {ep.target.pid}) lived"
            )
    if local.alive and ep.gone is None:
        ep.cores.update({p.pid: p.role for p in local.procs if p.role.startswith("EngineCore")})
    if ep.gone is None:
        return local
    why = ep.gone if local.alive else f"{ep.gone}; then {local.reason or 'the server exited'}"
    return replace(local, alive=False, reason=why)


def _keep_roles(local, previous):
    from dataclasses import replace

    return replace(local, procs=previous.procs) if local.alive else local
