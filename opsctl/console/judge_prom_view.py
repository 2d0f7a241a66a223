"""Prometheus answers -> the console's EndpointViews (pure), as the direct source's.

The same states as the direct source by construction: the state comes from
opsctl.console.judge_state.decide, fed what Prometheus knows (the scrape health of
/metrics and, when Prometheus also scrapes /health, of /health; running requests; the
stall rule replayed on Prometheus's raw samples by :class:`Progress`, which is
EndpointTracker's rule; restarts from ``resets()``/``changes()``).

Figures mirror opsctl.console.judge.figures: gauges and totals summed per endpoint,
rates from ``rate()`` over the rate window, interval ratios (prefix hits, tokens per
step, prompt sources) from ``increase()`` over it, else lifetime; percentiles from
``histogram_quantile()`` over the latency window where it saw requests, else lifetime."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from opsctl.console.judge import (
    RATES,
    RESET_COUNTERS,
    EndpointView,
    EngineInfo,
    EngineView,
    Figures,
    HttpStatus,
    ModelInfo,
    Quantiles,
    Scrape,
    Target,
    engine_order,
    engine_role,
    fractions,
    hit_rates,
    kv_tokens_of,
    tokens_per_step,
)
from opsctl.console.judge_prom import (
    ENGINE_TAGS,
    QNAMES,
    EnginePoints,
    InstanceData,
    Probe,
    PromTarget,
    Windows,
)
from opsctl.console.judge_state import (
    READY,
    EngineProgress,
    History,
    Progress,  # noqa: F401 - the one stall rule, read by both sources' tests from here
    Settings,
    decide,
    endpoint_view,
    judge_canary,
    judge_engines,
)
from opsctl.domain.metrics import LATENCY_HISTOGRAMS, RUNNING, MetricSamples

SOURCE = "prometheus"
_STATUS = re.compile(r"server returned HTTP status (\d{3})")


def kv_tokens(d: InstanceData) -> tuple[int | None, int | None]:
    """KV capacity and used tokens of one endpoint (opsctl.console.judge.kv_tokens_of).

    ``kv`` is the engines' mean usage; each engine has the cache cache_config_info gives."""
    engines = len(d.labelled.get("e.kv", {})) or int(d.get("engines") or 0) or 1
    return kv_tokens_of(d.cache, d.get("kv"), engines)


def engine_readings(d: InstanceData) -> list[EngineView]:
    """Each engine's figures from Prometheus's answer (the direct source's, per engine)."""
    seen = sorted({e for tag in ENGINE_TAGS for e in d.labelled.get(tag, {})}, key=engine_order)
    n = len(seen)

    def get(tag: str, e: str) -> float | None:
        return d.labelled.get(tag, {}).get(e)

    return [
        EngineView(
            engine=e,
            role=engine_role(e, n),
            running=get("e.running", e),
            waiting=get("e.waiting", e),
            kv_usage=get("e.kv", e),
            generation_tps=get("e.gen_tps", e),
            steps_per_s=get("e.steps_ps", e),
        )
        for e in seen
    ]


def latency(d: InstanceData) -> tuple[dict[str, Quantiles], str]:
    """Per histogram the window's figures where it saw requests, else the lifetime's.

    The basis rule of opsctl.console.judge.latency_figures."""
    out: dict[str, Quantiles] = {}
    basis = "none"
    for short in LATENCY_HISTOGRAMS:
        window = d.get(f"wc.{short}")
        life = d.get(f"lc.{short}")
        kind = "qw" if window else "ql"
        count, total = (window, d.get(f"ws.{short}")) if window else (life, d.get(f"ls.{short}"))
        if not count:
            if life is not None:
                out[short] = Quantiles()
            continue
        qs = [d.get(f"{kind}.{short}.{n}") for n in QNAMES]
        mean = None if total is None else total / count
        out[short] = Quantiles(qs[0], qs[1], qs[2], qs[3], mean, count)
        if window:
            basis = "window"
        elif basis == "none":
            basis = "lifetime"
    return out, basis


def figures(d: InstanceData) -> Figures:
    """The console's Figures of one endpoint from Prometheus's answer."""
    g = d.get
    hit, life_hit = hit_rates(g("d_prefix_h"), g("d_prefix_q"), g("prefix_h"), g("prefix_q"))
    per_step = tokens_per_step(g("d_step_tokens"), g("d_steps"), g("step_tokens"), g("steps"))
    sources = fractions(d.labelled.get("d_by_source")) or fractions(d.labelled.get("by_source"))
    lat, basis = latency(d)
    capacity, used = kv_tokens(d)
    rates: dict[str, Any] = {k: d.get(k) for k in RATES}
    return Figures(
        running=d.get("running"),
        waiting=d.get("waiting"),
        kv_usage=d.get("kv"),
        kv_capacity_tokens=capacity,
        kv_used_tokens=used,
        prefix_hit_rate=hit,
        prefix_hit_rate_lifetime=life_hit,
        tokens_per_step=per_step,
        preemptions_total=d.get("preempt_total"),
        prompt_tokens_total=d.get("prompt_total"),
        generation_tokens_total=d.get("gen_total"),
        requests_total=d.get("req_total"),
        prompt_tokens_by_source=sources,
        waiting_by_reason=dict(d.labelled.get("waiting_by_reason", {})),
        finished_by_reason=dict(d.labelled.get("finished", {})),
        engines=int(d.get("engines") or 0) or None,
        latency=lat,
        latency_basis=basis,
        **rates,
    )


# ---- health from scrape results -------------------------------------------------------------


def scrape_status(t: PromTarget, path: str, up: float | None = None) -> HttpStatus | None:
    """What Prometheus's last scrape of ``path`` said, as an HttpStatus.

    It is 200 when up, the HTTP status it reported when down (``server returned HTTP
    status 503 ...``), else no answer with Prometheus's error; None when not scraped
    yet. ``up`` (from the query) wins over the target list's health (both describe the
    same last scrape)."""
    health = t.health if up is None else ("up" if up >= 1 else "down")
    if t.last_scrape is None and up is None:
        return None
    if health == "up":
        return HttpStatus(path, 200, None, t.scrape_s)
    m = _STATUS.search(t.last_error)
    if m:
        return HttpStatus(path, int(m.group(1)), None, t.scrape_s)
    if health == "unknown":
        return None
    error = f"Prometheus scrape: {t.last_error or 'down'}"[:200]
    return HttpStatus(path, None, error, t.scrape_s)


def _samples(d: InstanceData | None) -> MetricSamples | None:
    """Just what decide() reads: running requests and whether the body was vLLM's."""
    if d is None or not d.models:
        return None
    running = d.get("running")
    values = {} if running is None else {RUNNING: running}
    engines = int(d.get("engines") or 0)
    return MetricSamples(values, {}, {}, {}, engines, len(d.models))


def as_scrape(
    t: PromTarget, health_t: PromTarget | None, d: InstanceData | None, now: float
) -> Scrape | None:
    """The scrape decide() needs, from Prometheus's view of one endpoint."""
    metrics = scrape_status(t, t.path or "/metrics", d.get("up") if d else None)
    health = scrape_status(health_t, health_t.path) if health_t is not None else None
    if health is None:
        health = metrics  # no /health scrape: the /metrics scrape stands for it
    if health is None or metrics is None:
        return None
    auth = next((s for s in (health, metrics) if s.status in (401, 403)), None)
    samples = _samples(d) if metrics.status == 200 else None
    at = (d.get("sample_t") if d and samples else None) or t.last_scrape or now
    return Scrape(t.url, at - (t.scrape_s or 0.0), at, health, metrics, samples, None, auth)


def target_of(t: PromTarget) -> Target:
    """The console's Target of a Prometheus target."""
    return Target(name=t.instance, url=t.url, source=SOURCE, labels=t.labels)


def restarted_recently(d: InstanceData) -> bool:
    """Whether a counter went back or the start time changed within the hold.

    A counter going back is ``resets()``; the hold is the restart hold."""
    keys = [f"resets.{i}" for i in range(len(RESET_COUNTERS))] + ["starts"]
    return any(d.get(k) for k in keys)


# ---- one endpoint over polls ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromPoll:
    """What one poll knows of one endpoint."""

    target: PromTarget
    health_target: PromTarget | None
    data: InstanceData | None
    points: EnginePoints  # the stall series' raw samples, per engine
    now: float


class PromEndpoint:
    """Folds the polls of one endpoint into views (the Prometheus source's tracker).

    EndpointTracker's role for the Prometheus source: the stall rule's memory, restarts
    seen, bounded history."""

    def __init__(self, target: PromTarget, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        s = self.settings
        self.target = target_of(target)
        self.progress = EngineProgress()
        self.readings: list[EngineView] = []
        self.history = History(s)
        self.figures = Figures()
        self.info = EngineInfo()
        self.scrapes = 0
        self.restarts = 0
        self.restarting = False
        self.last_ok_at: float | None = None
        self.view = self._view(None, None)

    def observe(self, poll: PromPoll) -> EndpointView:
        """Fold one poll into figures, restarts, history and state; return the view."""
        self.target = target_of(poll.target)
        self.scrapes += 1
        d = poll.data
        scrape = as_scrape(poll.target, poll.health_target, d, poll.now)
        ok = scrape is not None and scrape.samples is not None
        restarted = False
        if ok and d is not None:
            assert scrape is not None
            self.last_ok_at = scrape.finished_at
            self.progress.feed(poll.points)
            self.figures = figures(d)
            self.readings = engine_readings(d)
            restarted = restarted_recently(d)
            self.restarts += restarted and not self.restarting
            models = tuple(ModelInfo(m, None) for m in d.models)
            self.info = EngineInfo(None, models, None, poll.now)
            self.history.record(self.figures)
        self.restarting = restarted
        self.view = self._view(scrape, restarted)
        return self.view

    def _view(self, scrape: Scrape | None, restarted: bool | None) -> EndpointView:
        window = self.settings.stall_window_s
        stall_for = self.progress.stall(window)
        engines = judge_engines(self.readings, self.progress, window)
        if scrape is None or scrape.samples is None:
            stall_for, engines = None, ()
        state, reason = decide(scrape, None, stall_for, bool(restarted), engines)
        return endpoint_view(self, state, reason, scrape, None, engines)

    def series(self, name: str) -> list[float]:
        """One sparkline series of the endpoint's history."""
        return self.history.series(name)


def with_probe(view: EndpointView, probe: Probe | None, job: str) -> EndpointView:
    """``view`` after the blackbox canary's last probe of it (scrape job ``job``).

    A ready endpoint (idle by its gauges, /health 200) whose probe got no answer in time
    is stalled, as console --once's own canary judges (opsctl.console.judge_state
    .judge_canary): an engine stopped while idle shows no other sign. A probe answered
    with an error status, or that could not connect, leaves it as it was (the engine answered: inconclusive; the
    alert VllmCanaryFailed still fires on it); so does a success, or no probe."""
    if probe is None or probe.success or view.state != READY:
        return view
    took = f"{probe.seconds:.1f} s" if probe.seconds is not None else "its deadline"
    if probe.status:
        detail = f"the blackbox canary ({job}) was answered HTTP {probe.status} (inconclusive)"
        ok = None
    elif not probe.connected:
        detail = f"the blackbox canary ({job}) could not connect (inconclusive)"
        ok = None
    else:
        detail = f"the blackbox canary ({job}) got no 1-token completion within {took}"
        ok = False
    state, reason = judge_canary(view.state, view.reason, ok, detail)
    return replace(view, state=state, reason=reason)


# ---- the fleet --------------------------------------------------------------------------------


def select(
    targets: list[PromTarget], job: str | None, vllm_jobs: set[str]
) -> tuple[list[PromTarget], dict[str, PromTarget]]:
    """The endpoints to show (one per base URL) and the /health targets by base URL.

    The endpoints are metrics targets of ``job`` (without one: of every job exporting
    vLLM series); the /health targets come from any job."""
    health: dict[str, PromTarget] = {}
    chosen: dict[str, PromTarget] = {}
    for t in targets:
        if t.is_health:
            health.setdefault(t.url, t)
        elif (t.job == job) if job else (t.job in vllm_jobs):
            chosen.setdefault(t.url, t)
    return list(chosen.values()), health


def scrape_interval(targets: list[PromTarget], default: float) -> float:
    """The slowest scrape interval of the endpoints (their data is no fresher)."""
    found = [t.interval_s for t in targets if t.interval_s]
    return max(found) if found else default


def windows(settings: Settings, scrape_s: float) -> Windows:
    """The PromQL windows: rates, latency, restart hold and stall samples.

    Rates over the poll period but at least two scrapes (rate() needs two samples);
    latency over the direct source's window; restarts held as long as there; raw samples
    for the stall rule over the stall window plus two scrapes."""
    period = max(settings.interval_s, scrape_s)
    return Windows(
        rate_s=max(period, 2 * scrape_s),
        latency_s=settings.latency_window_s,
        restart_s=max(settings.restart_hold_s, 2 * scrape_s),
        stall_s=settings.stall_window_s + 2 * scrape_s,
    )


NO_HEALTH_HINT = (
    "Prometheus scrapes no /health of these servers: an engine that died while its API "
    "server still serves /metrics reads ready; add a scrape job with metrics_path: /health"
)


def fleet_hint(
    url: str,
    job: str | None,
    error: str | None,
    chosen: list[PromTarget],
    health: dict[str, PromTarget],
    jobs: set[str],
) -> str | None:
    """Why the fleet is empty or half-seen (error, no job, no /health); None when fine."""
    if error:
        return f"Prometheus at {url}: {error}"
    if not chosen:
        known = ", ".join(sorted(jobs)) or "none"
        if job:
            return f"Prometheus at {url} has no active targets in job {job!r} (jobs: {known})"
        return f"no job at Prometheus {url} exports vllm: series (jobs: {known}); pass --job"
    if not any(t.url in health for t in chosen):
        return NO_HEALTH_HINT
    return None


def settled(view: EndpointView) -> bool:
    """Scraped, and either not a live vLLM server or with rates (two samples)."""
    if view.last_scrape_at is None:
        return False
    f = view.figures
    return (
        view.last_ok_at is None or f.generation_tps is not None or f.generation_tokens_total is None
    )
