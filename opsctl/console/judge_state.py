"""Per-endpoint state machine of the console (pure: scrapes in, frozen views out).

Local process states come in too. See opsctl.console.judge for the states and the data
types."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol

from opsctl.console.judge import (
    BUSY,
    DEAD,
    READY,
    RESTARTED,
    STALLED,
    STARTING,
    UNAUTHORIZED,
    UNREACHABLE,
    Canary,
    EndpointView,
    EngineInfo,
    EngineView,
    Figures,
    HttpStatus,
    LocalState,
    Scrape,
    Target,
    engine_readings,
    figures,
    is_vllm,
    went_back,
)
from opsctl.domain import alert_rules
from opsctl.domain.metrics import (
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    MetricSamples,
    Point,
)
from opsctl.domain.ranks import engine_of

HISTORY_SERIES = ("generation_tps", "prompt_tps", "running", "waiting", "kv_usage", "ttft_p50")


@dataclass(frozen=True, slots=True)
class Settings:
    """The console's timings: poll interval, stall, latency, history and restart windows."""

    interval_s: float = 1.0
    stall_window_s: float = alert_rules.STALL_WINDOW_S  # the alerts' window too
    latency_window_s: float = 60.0
    history_s: float = 600.0  # sparklines: the last 10 minutes
    restart_hold_s: float = alert_rules.RESTART_HOLD_S  # 'restarted' shown this long
    # --once: the canary's deadline for a ready endpoint (None: no canary)
    canary_timeout_s: float | None = 10.0


def http_reason(scrape: Scrape) -> str:
    """Why an endpoint is unreachable or unhealthy, from its /health answer."""
    h = scrape.health
    if h.status is None:
        return f"no server answered (/health: {h.error or 'connection failed'})"
    return f"/health HTTP {h.status}"


def stopped_reason(stopped, health: int | None, engines: tuple[EngineView, ...] = ()) -> str:
    """Why an endpoint with stopped processes is stalled, naming each one.

    On a server of several data-parallel engines a stopped EngineCore_DPi or one of its
    workers is named with its engine (``engine 1 (EngineCore_DP1, pid N)``) and the
    other engines' states follow."""
    multi = len(engines) > 1
    who = ", ".join(_stopped_name(p, multi) for p in stopped)
    answer = f"/health {health}" if health is not None else "/health no answer"
    hit = {str(engine_of(p.role)) for p in stopped} if multi else set()
    rest = [others_text(e) for e in engines if e.engine not in hit] if multi else []
    others = "; " + "; ".join(rest) if rest else ""
    return f"{who} stopped (SIGSTOP or a debugger): nothing it holds can progress{others}; {answer}"


def _stopped_name(p, multi: bool) -> str:
    engine = engine_of(p.role) if multi else None
    return (
        f"engine {engine} ({p.role}, pid {p.pid})"
        if engine is not None
        else f"{p.role} (pid {p.pid})"
    )


def others_text(e: EngineView) -> str:
    """How a reason names an engine that is not the stalled one (``engine 0 progressing``)."""
    if e.state == STALLED:
        return f"{e.name}: {e.reason}"
    if not e.running:
        return f"engine {e.engine} idle"
    return f"engine {e.engine} progressing ({e.running:.0f} running)"


def engine_flat_text(e: EngineView, flat: float) -> str:
    """One engine's stall in words: its requests, waiting, how long flat (the rule's)."""
    waiting = f", {e.waiting:.0f} waiting" if e.waiting else ""
    return (
        f"{e.running or 0:.0f} requests running{waiting}, generation flat for {flat:.0f} s "
        "(engine steps and KV cache flat too)"
    )


def engines_reason(engines: tuple[EngineView, ...], health: int | None) -> str:
    """Why an endpoint of several engines is stalled: the stalled ones first, then the rest.

    ``engine 1 (EngineCore_DP1): 16 requests running, generation flat for 12 s (...);
    engine 0 progressing (3 running); /health 200``."""
    stalled = [e for e in engines if e.state == STALLED]
    parts = [f"{e.name}: {e.reason}" for e in stalled]
    parts += [others_text(e) for e in engines if e.state != STALLED]
    answer = f"/health {health}" if health is not None else "/health no answer"
    return "; ".join(parts) + f"; {answer}"


def judge_engines(
    readings: list[EngineView] | tuple[EngineView, ...],
    progress: EngineProgress,
    window_s: float,
) -> tuple[EngineView, ...]:
    """Each engine's state by the stall rule over its own series (the one definition).

    Stalled: requests running on it while its generation, steps and KV cache stayed
    flat for the stall window (``progress`` holds its memory); busy: requests running;
    ready otherwise."""
    out = []
    for e in readings:
        flat = progress.flat(e.engine)
        moved = progress.moved_engine(e.engine)
        if flat is not None and flat >= window_s:
            out.append(replace(e, state=STALLED, reason=engine_flat_text(e, flat), flat_s=flat,
                               progressing=moved))  # fmt: skip
        else:
            state = BUSY if e.running else READY
            out.append(replace(e, state=state, reason=None, flat_s=flat, progressing=moved))
    return tuple(out)


def with_stopped(
    engines: tuple[EngineView, ...], local: LocalState | None
) -> tuple[EngineView, ...]:
    """The engines with those whose EngineCore (or a worker of it) is stopped stalled.

    A stopped process of an engine (SIGSTOP, a debugger) holds it whatever its gauges
    say; only for a server of several engines (one engine: the endpoint says it)."""
    if len(engines) < 2 or local is None or not local.stopped:
        return engines
    hit: dict[str, list] = {}
    for p in local.stopped:
        engine = engine_of(p.role)
        if engine is not None:
            hit.setdefault(str(engine), []).append(p)
    out = []
    for e in engines:
        procs = hit.get(e.engine)
        if procs and e.state != STALLED:
            who = ", ".join(f"{p.role} (pid {p.pid})" for p in procs)
            e = replace(e, state=STALLED, reason=f"{who} stopped (SIGSTOP or a debugger)")
        out.append(e)
    return tuple(out)


def judge_canary(state: str, reason: str | None, ok: bool | None, detail: str):
    """The state after a canary: ready or busy with a late answer becomes stalled.

    A ready or busy endpoint whose 1-token completion did not return in time is stalled
    (its gauges are stale or it stopped while idle); an answer, or an inconclusive one,
    leaves the state as it was."""
    if ok is False and state in (READY, BUSY):
        return STALLED, f"canary: {detail}, while /health answers 200 and the gauges say {state}"
    return state, reason


def canary_engines(v: EndpointView) -> list[str]:
    """The engines of a server of several whose gauges cannot vouch for them: idle ones.

    A data-parallel engine stopped while idle, or hung while its gauges read 0 running,
    keeps /health 200 and its gauges still: only a request sent to it alone (vLLM's
    ``X-data-parallel-rank``) can tell. [] for one engine (the endpoint's canary) and for
    an endpoint that is not ready or busy."""
    if len(v.engines) < 2 or v.state not in (READY, BUSY):
        return []
    return [e.engine for e in v.engines if e.state == READY]


def judge_engine_canaries(v: EndpointView, results: dict[str, Canary]) -> EndpointView:
    """The view after a canary to some of its engines (engine label -> the result).

    An engine whose canary did not return in time is stalled (an answer, or an
    inconclusive one, leaves it as it was); the endpoint is stalled when any engine is,
    its reason naming the engine."""
    if not results:
        return v
    state, reason, engines = engine_canaries(v.state, v.reason, v.engines, v.health_status, results)
    return replace(v, state=state, reason=reason, engines=engines)


def engine_canaries(
    state: str,
    reason: str | None,
    engines_in: tuple[EngineView, ...],
    health: int | None,
    results: dict[str, Canary],
) -> tuple[str, str | None, tuple[EngineView, ...]]:
    """:func:`judge_engine_canaries` on its parts: (state, reason, engines) after them."""
    engines = []
    for e in engines_in:
        r = results.get(e.engine)
        if r is not None:
            e = replace(e, canary=r)
            if r.ok is False and e.state in (READY, BUSY):
                said = "idle" if not e.running else f"{e.running:.0f} running"
                why = f"canary: {r.detail}, while its gauges say {said}"
                e = replace(e, state=STALLED, reason=why)
        engines.append(e)
    out = tuple(engines)
    if state in (READY, BUSY) and any(e.state == STALLED for e in out):
        return STALLED, engines_reason(out, health), out
    return state, reason, out


def decide(
    scrape: Scrape | None,
    local: LocalState | None,
    stall_for: float | None,
    restarted_recently: bool,
    engines: tuple[EngineView, ...] = (),
) -> tuple[str, str | None]:
    """The state of one endpoint and the reason for any state but ready/busy.

    ``stall_for``: seconds the generation and engine-step counters and the KV cache's
    usage have been flat while requests were running (None when any moves or nothing
    runs): a stall is flat in all three, since each counts as progress. ``engines``: its
    data-parallel engines judged on their own (:func:`judge_engines`); with several, the
    endpoint is stalled when ANY is, and the reason names it (``stall_for`` is then the
    single engine's rule, unused)."""
    if local is not None and not local.alive:
        why = local.reason or "process gone"
        if local.death_lines:
            why += ": " + " | ".join(local.death_lines)
        return DEAD, why
    if scrape is None:
        return (STARTING, local.load_phase) if local is not None else (UNREACHABLE, "not polled")
    auth = scrape.auth
    if auth is not None and auth.status in (401, 403):
        return UNAUTHORIZED, f"HTTP {auth.status} on {auth.path}: pass --api-key (or api_key_env)"
    health = scrape.health.status
    if local is not None and local.stopped:
        return STALLED, stopped_reason(local.stopped, health, engines)
    if health is None:
        if local is not None and local.alive:
            phase = local.load_phase or "process up, HTTP not answering yet"
            return STARTING, phase
        return UNREACHABLE, http_reason(scrape)
    if health >= 500:
        lines = f": {' | '.join(local.death_lines)}" if local and local.death_lines else ""
        return DEAD, f"/health HTTP {health}{lines}"
    if health != 200 or not is_vllm(scrape.samples):
        metrics = scrape.metrics.status
        return UNREACHABLE, (
            f"not a vLLM server (answers HTTP: /health {health}, /metrics "
            f"{metrics if metrics is not None else 'no answer'}, no vllm: series)"
        )
    if len(engines) > 1 and any(e.state == STALLED for e in engines):
        return STALLED, engines_reason(engines, health)
    if stall_for is not None and len(engines) < 2:
        running = scrape.samples.get(RUNNING) if scrape.samples else None
        return STALLED, (
            f"{running or 0:.0f} requests running{waiting_text(scrape.samples)}, generation "
            f"tokens flat for {stall_for:.0f} s (engine steps and KV cache flat too); /health {health}"
        )
    if restarted_recently:
        return RESTARTED, "counters went back: the server restarted"
    running = scrape.samples.get(RUNNING) if scrape.samples else None
    return (BUSY, None) if running else (READY, None)


def waiting_text(samples: MetricSamples | None) -> str:
    """The waiting requests by reason, as a stall reason's suffix ('' when none).

    ``, 3 waiting (capacity 1, deferred 2: ...)`` for a stall's reason: requests the
    scheduler skips (vLLM's waiting-by-reason, #56640: LoRA budget, KV transfer, blocked)
    are named; empty when nothing waits."""
    waiting = samples.get(WAITING) if samples else None
    if not waiting:
        return ""
    by = samples.labelled.get(WAITING_BY_REASON, {}) if samples else {}
    parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items()) if v)
    deferred = " (deferred: skipped by the scheduler for the LoRA budget, a KV transfer or a block)"
    note = deferred if by.get("deferred") else ""
    return f", {waiting:.0f} waiting" + (f" ({parts}){note}" if parts else "")


def merge_info(old: EngineInfo, new: EngineInfo) -> EngineInfo:
    """The engine facts after a fetch: replaced when complete, else filled in.

    A complete fetch (every path answered) replaces them; an incomplete one
    (``fetched_at`` None) only fills in what it got, and keeps the old ``fetched_at`` so
    that the fetch is tried again."""
    if new.fetched_at is not None:
        return new
    return EngineInfo(
        version=new.version if new.version is not None else old.version,
        models=new.models or old.models,
        server_info=new.server_info if new.server_info is not None else old.server_info,
        fetched_at=old.fetched_at,
    )


class Tracked(Protocol):
    """What the tracker of either source holds for a view (EndpointTracker, PromEndpoint)."""

    target: Target
    figures: Figures
    info: EngineInfo
    last_ok_at: float | None
    scrapes: int
    restarts: int
    progress: EngineProgress


def endpoint_view(
    memory: Tracked,
    state: str,
    reason: str | None,
    scrape: Scrape | None,
    local: LocalState | None = None,
    engines: tuple[EngineView, ...] = (),
) -> EndpointView:
    """The view of one endpoint from its state, last scrape and tracker's memory.

    Its state and reason, its last scrape, its local processes, its engines, and what
    the tracker of either source (``memory``) holds."""
    return EndpointView(
        target=memory.target,
        state=state,
        reason=reason,
        figures=memory.figures,
        info=memory.info,
        local=local,
        health_status=scrape.health.status if scrape else None,
        last_scrape_at=scrape.finished_at if scrape else None,
        last_ok_at=memory.last_ok_at,
        scrapes=memory.scrapes,
        restarts=memory.restarts,
        poll_s=(scrape.finished_at - scrape.started_at) if scrape else None,
        progressing=memory.progress.moved,
        engines=engines,
    )


# ---- the stall rule and the sparklines' history (both sources) -------------------------------


class Progress:
    """The stall rule's memory for one endpoint, the one for both sources.

    It holds the last time generation or the engine steps moved (or nothing ran). The
    direct source feeds one point per scrape, the Prometheus source overlapping ranges of
    raw samples poll after poll (a sample is used once).
    Progress is a generated token, an engine step or a change of the KV cache's usage: a
    slowed engine steps on, and a long prefill, which vLLM (0.32 measured) publishes no
    step or token for until it ends, fills the KV cache chunk by chunk: slow, not
    stalled."""

    def __init__(self) -> None:
        self.last: Point | None = None
        self.progress_at: float | None = None
        self.moved = False  # the last point moved against the one before it

    def feed(self, points: list[Point]) -> None:
        """Take raw (time, running, generation, steps, KV usage) points; note progress."""
        for p in points:
            if self.last is not None and p[0] <= self.last[0]:
                continue
            t, running = p[0], p[1]
            prev = self.last
            self.moved = prev is not None and p[2:] != prev[2:]
            moved = prev is None or self.moved
            if running <= 0 or moved or self.progress_at is None:
                self.progress_at = t
            self.last = p

    def stall(self, window_s: float) -> float | None:
        """Seconds generation, steps and KV usage have been flat with requests running.

        None below the stall window."""
        flat = self.flat()
        return None if flat is None or flat < window_s else flat

    def flat(self) -> float | None:
        """Seconds flat with requests running so far (0 just after progress); None idle."""
        if self.last is None or self.progress_at is None or self.last[1] <= 0:
            return None
        return self.last[0] - self.progress_at


class EngineProgress:
    """The stall rule's memory for one endpoint: one :class:`Progress` per engine.

    Keyed by vLLM's ``engine`` label (one data-parallel engine each; a single-engine
    server has one). Each engine's points feed its own memory, so the progress of one
    engine never hides another's stall (summed counters did). Both sources use it."""

    def __init__(self) -> None:
        self.engines: dict[str, Progress] = {}

    def feed(self, points: dict[str, list[Point]]) -> None:
        """Take each engine's raw (time, running, generation, steps, KV usage) points."""
        for engine, pts in points.items():
            self.engines.setdefault(engine, Progress()).feed(pts)

    @property
    def moved(self) -> bool:
        """Whether any engine's reading moved at its last point."""
        return any(p.moved for p in self.engines.values())

    def moved_engine(self, engine: str) -> bool:
        """Whether ``engine``'s reading moved at its last point."""
        p = self.engines.get(engine)
        return p is not None and p.moved

    def flat(self, engine: str) -> float | None:
        """Seconds ``engine`` has been flat with requests running (None: idle, unknown)."""
        p = self.engines.get(engine)
        return None if p is None else p.flat()

    def stall(self, window_s: float) -> float | None:
        """The single engine's stall (:meth:`Progress.stall`); None with several engines.

        A server of several engines is judged engine by engine (:func:`judge_engines`)."""
        if len(self.engines) != 1:
            return None
        return next(iter(self.engines.values())).stall(window_s)


def engine_points(samples: MetricSamples, t: float) -> dict[str, list[Point]]:
    """The stall rule's reading of each engine of one scrape at time ``t``."""
    return {e: [samples.engine_point(e, t)] for e in samples.by_engine()}


class History:
    """Bounded history of one endpoint's figures for the sparklines.

    HISTORY_SERIES, ``history_s`` long at ``interval_s``; the same for both sources."""

    def __init__(self, settings: Settings) -> None:
        n = max(2, int(settings.history_s / max(settings.interval_s, 0.05)))
        self._series: dict[str, deque[float | None]] = {k: deque(maxlen=n) for k in HISTORY_SERIES}

    def record(self, f: Figures) -> None:
        """Append the sparkline series of one scrape's figures."""
        ttft = f.latency.get("ttft")
        values = {
            "generation_tps": f.generation_tps,
            "prompt_tps": f.prompt_tps,
            "running": f.running,
            "waiting": f.waiting,
            "kv_usage": f.kv_usage,
            "ttft_p50": ttft.p50 if ttft and f.latency_basis == "window" else None,
        }
        for k, v in values.items():
            self._series[k].append(v)

    def series(self, name: str) -> list[float]:
        """One series for a sparkline (missing points as 0)."""
        return [v or 0.0 for v in self._series[name]]


class EndpointTracker:
    """Folds the scrapes of one endpoint into views (direct source).

    Keeps the previous samples for rates, the samples inside the latency window for
    percentiles, and bounded history."""

    def __init__(self, target: Target, settings: Settings | None = None) -> None:
        self.target = target
        self.settings = settings or Settings()
        s = self.settings
        self.prev: tuple[float, MetricSamples] | None = None
        self.window: deque[tuple[float, MetricSamples]] = deque(
            maxlen=max(2, int(s.latency_window_s / max(s.interval_s, 0.05)) + 2)
        )
        self.history = History(s)
        self.progress = EngineProgress()
        self.readings: list[EngineView] = []  # each engine's figures at the last scrape
        self.info = EngineInfo()
        self.info_auth: HttpStatus | None = None
        self.local: LocalState | None = None
        self.last: Scrape | None = None
        self.last_ok_at: float | None = None
        self.figures = Figures()
        self.scrapes = 0
        self.restarts = 0
        self.restarted_at: float | None = None
        self.view = self._view()

    def set_local(self, local: LocalState | None) -> EndpointView:
        """Take the endpoint's local process state; return the new view."""
        self.local = local
        self.view = self._view()
        return self.view

    def observe(self, scrape: Scrape) -> EndpointView:
        """Fold one scrape into rates, percentiles, history and state; return the view."""
        self.scrapes += 1
        if scrape.info is not None:
            self.info = merge_info(self.info, scrape.info)
            self.info_auth = scrape.auth  # vLLM guards /v1/* only: remember what it said
        if scrape.auth is None and self.info_auth is not None:
            scrape = replace(scrape, auth=self.info_auth)
        self.last = scrape
        cur = scrape.samples if is_vllm(scrape.samples) else None
        if cur is not None:
            self._observe_samples(scrape.finished_at, cur)
        self.view = self._view()
        return self.view

    def _observe_samples(self, t: float, cur: MetricSamples) -> None:
        self.last_ok_at = t
        prev = self.prev[1] if self.prev else None
        if went_back(prev, cur):
            self.restarts += 1
            self.restarted_at = t
            self.window.clear()
            self.prev = None
            prev = None
        self.progress.feed(engine_points(cur, t))
        dt = t - self.prev[0] if self.prev else None
        self.window.append((t, cur))
        while self.window and t - self.window[0][0] > self.settings.latency_window_s:
            self.window.popleft()
        self.figures = figures(cur, prev, dt, self.window[0][1] if self.window else None)
        self.readings = engine_readings(cur, prev, dt)
        self.prev = (t, cur)
        self.history.record(self.figures)

    def _stall(self) -> float | None:
        if self.last_ok_at is None:
            return None
        return self.progress.stall(self.settings.stall_window_s)

    def _view(self) -> EndpointView:
        stall_for = self._stall()
        recent = (
            self.restarted_at is not None
            and self.last_ok_at is not None
            and self.last_ok_at - self.restarted_at < self.settings.restart_hold_s
        )
        engines = judge_engines(self.readings, self.progress, self.settings.stall_window_s)
        engines = with_stopped(engines, self.local)
        state, reason = decide(self.last, self.local, stall_for, recent, engines)
        return endpoint_view(self, state, reason, self.last, self.local, engines)

    def series(self, name: str) -> list[float]:
        """History for a sparkline (missing points as 0)."""
        return self.history.series(name)


def state_counts(views: tuple[EndpointView, ...] | list[EndpointView]) -> dict[str, int]:
    """How many endpoints are in each state."""
    out: dict[str, int] = {}
    for v in views:
        out[v.state] = out.get(v.state, 0) + 1
    return out


UNHEALTHY_FOR_EXIT = (STALLED, DEAD, UNAUTHORIZED, UNREACHABLE, STARTING)

NO_ENDPOINT = {
    "direct": "no vLLM server found (no URL argument, no --targets entry, none discovered)",
    "prometheus": "no vLLM server found among the Prometheus server's active targets",
}


def exit_code(views: tuple[EndpointView, ...] | list[EndpointView]) -> int:
    """The fleet's exit code: 0 healthy, 1 any failing, 3 none reachable (or none).

    Healthy is ready, busy or restarted. An empty fleet is 3 too: a health gate that
    checked nothing does not pass."""
    return verdict(views)[0]


CANARY_HELP = (
    "the deadline of the canary, a 1-token completion sent to a server whose gauges cannot "
    "vouch for it (an engine stopped while idle keeps /health 200): none in time is stalled"
)
GIVEN = ("argument", "targets")  # endpoints the operator named (not discovered)


def verdict(
    views: tuple[EndpointView, ...] | list[EndpointView], source: str = "direct"
) -> tuple[int, str]:
    """The exit code of ``--once`` and its one-line reason.

    With endpoints the operator named, the verdict is about those: discovered servers
    are shown, not judged."""
    from opsctl.console.judge import REACHABLE

    if any(v.target.source in GIVEN for v in views):
        views = [v for v in views if v.target.source in GIVEN]
    if not views:
        return 3, NO_ENDPOINT.get(source, "no vLLM server found")
    counts = ", ".join(f"{n} {state}" for state, n in sorted(state_counts(views).items()))
    of = f"of {len(views)} endpoint{'s' if len(views) != 1 else ''}"
    if not any(v.state in REACHABLE for v in views):
        first = views[0]
        return 3, f"no vLLM server answered ({counts}): {first.target.url}: {first.reason}"
    bad = [v for v in views if v.state in UNHEALTHY_FOR_EXIT]
    if bad:
        failing = state_counts(bad)
        what = ", ".join(f"{n} {state}" for state, n in sorted(failing.items()))
        return 1, f"{what} {of} ({counts})"
    return 0, f"all {len(views)} healthy ({counts})"


# ---- --once: observe until every endpoint is decided ----------------------------------------


def undecided(v: EndpointView) -> bool:
    """Whether a one-shot look must watch longer before the endpoint is busy or stalled.

    For a one-shot look (``--once``): the endpoint has requests running and none of
    its generation counter, its engine steps and its KV cache's usage was seen moving
    over the last interval (or there is no rate yet), and the stall window has not
    passed: it may be busy or stalling, so it needs a longer look. Progress makes it
    busy; the window passing makes it stalled."""
    if v.state not in (BUSY, RESTARTED) or not v.figures.running:
        return False
    if len(v.engines) > 1:  # each engine on its own: one moving decides no other
        return any(engine_undecided(e) for e in v.engines)
    if v.progressing:  # a token, a step or the KV cache filling (a long prefill) since
        return False  # the scrape before: slow at worst, decided busy
    return not moving(v.figures.generation_tps, v.figures.steps_per_s)


def moving(tps: float | None, steps: float | None) -> bool:
    """Whether the last interval's rates show progress (a token or an engine step)."""
    if steps is not None and steps > 0:  # a long prefill steps on: slow, decided busy
        return True
    return tps is not None and tps > 0


def engine_undecided(e: EngineView) -> bool:
    """:func:`undecided` for one engine: requests running on it, none seen moving yet."""
    if e.state == STALLED or not e.running or e.progressing:
        return False
    return not moving(e.generation_tps, e.steps_per_s)


def settle_undecided(
    views: tuple[EndpointView, ...], observed_s: float, stall_window_s: float
) -> tuple[EndpointView, ...]:
    """End of ``--once``: an endpoint still undecided after the stall window is stalled.

    Undecided: its scrapes came too late or too sparse for the tracker's own rule. A
    health gate never passes what it never saw move."""
    if observed_s < stall_window_s:
        return views
    out = []
    for v in views:
        if undecided(v) and len(v.engines) > 1:
            engines = tuple(
                replace(e, state=STALLED, reason=unseen_text(e.running, observed_s, stall_window_s))
                if engine_undecided(e)
                else e
                for e in v.engines
            )
            v = replace(v, state=STALLED, reason=engines_reason(engines, v.health_status),
                        engines=engines)  # fmt: skip
        elif undecided(v):
            why = unseen_text(v.figures.running, observed_s, stall_window_s)
            v = replace(v, state=STALLED, reason=f"{why}; /health {v.health_status}")
        out.append(v)
    return tuple(out)


def unseen_text(running: float | None, observed_s: float, stall_window_s: float) -> str:
    """Why ``--once`` settles a look as stalled: requests running, nothing seen moving."""
    return (
        f"{running or 0:.0f} requests running, generation, engine steps and KV cache not seen "
        f"moving in {observed_s:.0f} s of observation (stall window {stall_window_s:g} s)"
    )


__all__ = [
    "BUSY",
    "READY",
    "EndpointTracker",
    "Settings",
    "decide",
    "exit_code",
    "settle_undecided",
    "state_counts",
    "undecided",
    "verdict",
]
