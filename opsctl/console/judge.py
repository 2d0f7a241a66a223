"""The console's decisions (pure): endpoint states, rates, percentiles and history.

Endpoint states from scrapes, rates from counter deltas (resets detected and counted,
never negative), latency percentiles from histogram bucket deltas over a window, bounded
history for sparklines.

Collectors produce :class:`Scrape` and :class:`LocalState` snapshots; an
:class:`EndpointTracker` (one per endpoint) folds them into frozen
:class:`EndpointView` values that the JSON output and the TUI both render.

States: starting (local process up, no HTTP yet), ready, busy (requests running),
stalled (requests running while generation stays flat for the stall window, /health may
still say 200), dead (/health 5xx or the process gone), unreachable (nothing answers,
or what answers is not vLLM), unauthorized (401/403), restarted (counters went back)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from opsctl.console.judge_endpoint_notes import Advice, FiredAlert
from opsctl.console.judge_logview import LogFacts  # runtime: the replay decodes by type hints
from opsctl.console.judge_requests import RequestsView
from opsctl.domain.gpu import GpuDevice, HostGpus
from opsctl.domain.metrics import (
    GEN_TOKENS,
    KV_USAGE,
    LATENCY_HISTOGRAMS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_BY_SOURCE,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    RUNNING,
    STEP_TOKENS_SUM,
    STEPS,
    WAITING,
    WAITING_BY_REASON,
    Buckets,
    MetricSamples,
    bucket_delta,
    histogram_quantile,
)

STARTING, READY, BUSY, STALLED = "starting", "ready", "busy", "stalled"
DEAD, UNREACHABLE, UNAUTHORIZED, RESTARTED = "dead", "unreachable", "unauthorized", "restarted"
STATES = (STARTING, READY, BUSY, STALLED, DEAD, UNREACHABLE, UNAUTHORIZED, RESTARTED)
HEALTHY = frozenset({READY, BUSY, RESTARTED})
FAILING = frozenset({STALLED, DEAD, UNAUTHORIZED, UNREACHABLE})
REACHABLE = frozenset({READY, BUSY, STALLED, DEAD, UNAUTHORIZED, RESTARTED})
SOURCES = ("argument", "targets", "opsctl-run", "discovered")
QUANTILES = (0.5, 0.9, 0.95, 0.99)
# counters whose going back means the server restarted (both sources)
RESET_COUNTERS = (GEN_TOKENS, PROMPT_TOKENS, STEPS, REQUEST_SUCCESS)
# rate figure (a Figures field) -> the counter it is the rate of (both sources)
RATES = {
    "prompt_tps": PROMPT_TOKENS,
    "generation_tps": GEN_TOKENS,
    "request_rate": REQUEST_SUCCESS,
    "preemption_rate": PREEMPTIONS,
    "steps_per_s": STEPS,
}


# ---- inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint to watch and where it came from."""

    name: str
    url: str
    source: str  # one of SOURCES
    labels: tuple[tuple[str, str], ...] = ()
    api_key_env: str | None = None
    pid: int | None = None  # local API server process
    pid_started: float | None = None  # its create time (tells a reused pid apart)
    run_dir: str | None = None  # opsctl runs
    log_file: str | None = None  # a log to tail for it (targets file 'log', --log URL=FILE)

    @property
    def key(self) -> str:
        """The target's identity in the fleet: its URL."""
        return self.url


@dataclass(frozen=True, slots=True)
class HttpStatus:
    """What one HTTP request of a scrape got: the path, its status or why none came."""

    path: str
    status: int | None  # None: no HTTP answer
    error: str | None = None  # connect error / timeout text
    elapsed_s: float | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model an endpoint serves (/v1/models): its id, context length and root."""

    id: str
    max_model_len: int | None
    root: str | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Slow-changing facts (fetched on the first answer, after a restart, now and then)."""

    version: str | None = None
    models: tuple[ModelInfo, ...] = ()
    server_info: dict | None = None  # /server_info (VLLM_SERVER_DEV_MODE=1 only)
    fetched_at: float | None = None


@dataclass(frozen=True, slots=True)
class Scrape:
    """One poll of one endpoint."""

    url: str
    started_at: float
    finished_at: float
    health: HttpStatus
    metrics: HttpStatus
    samples: MetricSamples | None  # parsed /metrics (None when it did not answer 200)
    info: EngineInfo | None = None  # set when fetched in this poll
    auth: HttpStatus | None = None  # a 401/403 seen on any path


@dataclass(frozen=True, slots=True)
class ProcRole:
    """One local process of an endpoint and its role (API server, EngineCore, worker)."""

    pid: int
    role: str


@dataclass(frozen=True, slots=True)
class LocalState:
    """What the local machine says about an endpoint's processes (local ones only)."""

    alive: bool
    reason: str | None = None  # why not alive ("process 123 exited")
    procs: tuple[ProcRole, ...] = ()
    load_phase: str | None = None  # opsctl runs: from the server log
    death_lines: tuple[str, ...] = ()  # opsctl runs: decisive log lines
    # processes of the tree that are stopped (SIGSTOP, a debugger's stop): they answer
    # nothing, while the API server may still answer /health 200
    stopped: tuple[ProcRole, ...] = ()
    # opsctl runs: the rank that ended first, how, and what the others did
    # (opsctl.domain.deaths.FirstDeath.summary); also while the API server still runs
    first_death: str | None = None


# ---- outputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Latency percentiles and mean of one histogram, with the count they are over."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: float = 0.0  # observations the figures are taken over


@dataclass(frozen=True, slots=True)
class Figures:
    """An endpoint's figures from one scrape: gauges, rates, ratios, totals and latency."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    kv_capacity_tokens: int | None = None
    kv_used_tokens: int | None = None
    prefix_hit_rate: float | None = None  # over the last interval with queries, else lifetime
    prefix_hit_rate_lifetime: float | None = None
    prompt_tps: float | None = None
    generation_tps: float | None = None
    request_rate: float | None = None
    preemption_rate: float | None = None
    steps_per_s: float | None = None
    tokens_per_step: float | None = None
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    requests_total: float | None = None
    prompt_tokens_by_source: dict[str, float] = field(default_factory=dict)  # fractions
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    finished_by_reason: dict[str, float] = field(default_factory=dict)  # totals
    engines: int | None = None
    latency: dict[str, Quantiles] = field(default_factory=dict)
    latency_basis: str = "none"  # "window" (last latency_window_s) | "lifetime" | "none"


@dataclass(frozen=True, slots=True)
class Canary:
    """What one canary request found: answered in time, hung, or answered with an error.

    The canary is one 1-token completion with a deadline (opsctl.collectors.canary).
    ``ok``: True answered in time, False no answer within the deadline (the hang a
    canary exists for), None answered with an error (the engine answered: inconclusive)."""

    ok: bool | None
    seconds: float
    detail: str

    def to_dict(self) -> dict:
        """The canary's result as a JSON object (ok, seconds, detail)."""
        return {"ok": self.ok, "seconds": round(self.seconds, 3), "detail": self.detail}


@dataclass(frozen=True, slots=True)
class EngineView:
    """One data-parallel engine of an endpoint (vLLM's ``engine`` label) judged on its own.

    Its state (ready, busy, stalled) by the stall rule over its own series, so one
    engine that stalls among healthy ones is seen (opsctl.console.judge_state)."""

    engine: str  # the engine label: "0", "1", ... (a series without one is engine "0")
    role: str  # the EngineCore it is: EngineCore (one engine), EngineCore_DP1, ...
    state: str = READY  # ready | busy | stalled
    reason: str | None = None  # why stalled (its own words, without the engine's name)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    generation_tps: float | None = None
    steps_per_s: float | None = None
    # seconds its generation, steps and KV cache have been flat with requests running
    # (0 when it moved at the last reading; None when nothing runs on it)
    flat_s: float | None = None
    progressing: bool = False  # its stall series moved at the last reading
    # the canary sent to this engine alone (X-data-parallel-rank), None when none was
    canary: Canary | None = None

    @property
    def name(self) -> str:
        """How a reason names it: ``engine 1 (EngineCore_DP1)``."""
        return f"engine {self.engine} ({self.role})"

    def to_dict(self) -> dict[str, Any]:
        """The engine as the console's and status's documents hold it."""

        def r(v: float | None, nd: int) -> float | None:
            return None if v is None else round(v, nd)

        return {
            "engine": self.engine,
            "role": self.role,
            "state": self.state,
            "reason": self.reason,
            "requests_running": self.running,
            "requests_waiting": self.waiting,
            "kv_cache_usage": r(self.kv_usage, 4),
            "generation_tokens_per_s": r(self.generation_tps, 2),
            "engine_steps_per_s": r(self.steps_per_s, 2),
            "flat_s": r(self.flat_s, 2),
            "stalled_for_s": r(self.flat_s, 2) if self.state == STALLED else None,
            "canary": self.canary.to_dict() if self.canary is not None else None,
        }


def engine_role(engine: str, count: int) -> str:
    """The EngineCore behind an ``engine`` label: ``EngineCore_DP1`` (DP), ``EngineCore``.

    vLLM's process title of that engine (opsctl.domain.ranks), so a reason names what
    ``ps``, the log prefixes and the console's process view name."""
    return f"EngineCore_DP{engine}" if count > 1 else "EngineCore"


def engine_order(engine: str) -> tuple[int, str]:
    """Sort key of engine labels: numerically (2 before 10), others after."""
    return (int(engine), "") if engine.isdigit() else (1 << 30, engine)


@dataclass(frozen=True, slots=True)
class EndpointView:
    """What the console shows of one endpoint: its state, reason, figures and facts."""

    target: Target
    state: str
    reason: str | None
    figures: Figures
    info: EngineInfo
    local: LocalState | None
    health_status: int | None
    last_scrape_at: float | None
    last_ok_at: float | None  # last scrape with a vLLM answer
    scrapes: int
    restarts: int
    poll_s: float | None  # how long the last poll took
    # the GPUs any of the endpoint's local processes use (opsctl.domain.gpu.GpuDevice,
    # processes narrowed to this endpoint's, with roles); () when none or unknown
    gpus: tuple[GpuDevice, ...] = ()
    # the advisor's findings from this endpoint's window of figures (opsctl.console.judge_advisor;
    # the state's findings are added when shown: advisor.findings(view))
    findings: tuple[Advice, ...] = ()
    # the live requests of a tee proxy in front of this server (console --tee;
    # opsctl.console.judge_requests.RequestsView), None without one
    requests: RequestsView | None = None
    # a log file tailed for this server (console --log / targets 'log';
    # opsctl.console.judge_logview.LogFacts), None without one
    log: LogFacts | None = None
    # the alerts firing for this endpoint in Prometheus (console --prometheus; opsctl
    # .domain.alert_rules.FiredAlert, most severe first); () for other sources
    alerts: tuple[FiredAlert, ...] = ()
    # the stall rule's reading moved at the last scrape (a token, a step, the KV cache)
    progressing: bool = False
    # each data-parallel engine judged on its own (EngineView, engine order); one entry
    # for a single-engine server; () before the first vLLM answer
    engines: tuple[EngineView, ...] = ()

    def stalled_engines(self) -> tuple[EngineView, ...]:
        """The engines that are stalled (of a server with several; () for one)."""
        if len(self.engines) < 2:
            return ()
        return tuple(e for e in self.engines if e.state == STALLED)

    def age(self, now: float) -> float | None:
        """Seconds since the last good scrape; None before the first."""
        return None if self.last_ok_at is None else max(0.0, now - self.last_ok_at)


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every endpoint's view at one moment, with the source, pause and host GPUs."""

    taken_at: float
    endpoints: tuple[EndpointView, ...]
    interval_s: float
    source: str = "direct"  # which FleetSource produced it
    paused: bool = False
    hint: str | None = None
    host_gpus: HostGpus | None = None  # None: not collected


# ---- pure helpers ---------------------------------------------------------------------------


def counter_delta(prev: float | None, cur: float | None) -> float | None:
    """Increase of a counter, never negative (after a reset: ``cur``).

    A reset is ``cur < prev``: the counter restarted from zero."""
    if prev is None or cur is None:
        return None
    return cur if cur < prev else cur - prev


def went_back(prev: MetricSamples | None, cur: MetricSamples) -> bool:
    """Whether a restart counter fell from ``prev`` to ``cur`` (the server restarted)."""
    if prev is None:
        return False
    for name in RESET_COUNTERS:
        a, b = prev.get(name), cur.get(name)
        if a is not None and b is not None and b < a:
            return True
    return False


def quantiles(buckets: Buckets | None, total_sum: float | None = None) -> Quantiles:
    """Percentiles and mean of a histogram's buckets; empty without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return Quantiles()
    count = buckets[-1][1]
    p50, p90, p95, p99 = (histogram_quantile(buckets, q) for q in QUANTILES)
    mean = None if total_sum is None else total_sum / count
    return Quantiles(p50, p90, p95, p99, mean, count)


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den`` held to 0..1; None without a numerator or with a zero denominator."""
    if num is None or not den:
        return None
    return max(0.0, min(1.0, num / den))


def kv_engines(s: MetricSamples) -> int:
    """How many engines report a KV cache usage gauge (1 at least)."""
    return sum(1 for d in s.by_engine().values() if KV_USAGE in d) or 1


def kv_usage(s: MetricSamples) -> float | None:
    """The KV cache's usage of the endpoint: its engines' mean (each engine its own cache).

    vLLM exports one usage fraction per data-parallel engine; their sum would read 130 %
    on two engines 65 % full. One engine: its gauge, as before."""
    total = s.get(KV_USAGE)
    return None if total is None else total / kv_engines(s)


def kv_tokens(s: MetricSamples) -> tuple[int | None, int | None]:
    """KV capacity and used tokens: blocks x block size from vllm:cache_config_info."""
    return kv_tokens_of(s.info, kv_usage(s), kv_engines(s))


def kv_tokens_of(
    cache: dict[str, str], usage: float | None, engines: int = 1
) -> tuple[int | None, int | None]:
    """KV capacity and used tokens from cache_config_info's labels and the usage gauge.

    ``usage`` the engines' mean and ``engines`` how many there are: each data-parallel
    engine has a cache of the size one engine's cache_config_info gives."""
    try:
        capacity = int(cache["num_gpu_blocks"]) * int(cache["block_size"]) * max(1, engines)
    except (KeyError, ValueError):
        return None, None
    return capacity, None if usage is None else round(capacity * usage)


def fractions(d: dict[str, float] | None) -> dict[str, float]:
    """Each value's share of the total ({} when the total is not positive)."""
    total = sum((d or {}).values())
    return {k: v / total for k, v in (d or {}).items()} if total > 0 else {}


def _source_fractions(cur: MetricSamples, prev: MetricSamples | None) -> dict[str, float]:
    now = cur.labelled.get(PROMPT_BY_SOURCE, {})
    if prev is not None:
        before = prev.labelled.get(PROMPT_BY_SOURCE, {})
        delta = {k: v - before.get(k, 0.0) for k, v in now.items()}
        if sum(delta.values()) > 0 and min(delta.values()) >= 0:
            return fractions(delta)
    return fractions(now)


def figures(
    cur: MetricSamples,
    prev: MetricSamples | None,
    dt: float | None,
    window: MetricSamples | None,
) -> Figures:
    """Figures of one scrape: gauges, rates since ``prev`` and windowed percentiles.

    Gauges from ``cur``; rates over ``prev`` -> ``cur`` (dt seconds; None after a reset
    or on the first scrape); percentiles over ``window`` -> ``cur`` (the oldest scrape
    inside the latency window), else over the lifetime."""
    rates: dict[str, Any] = {}
    for key, name in RATES.items():
        d = counter_delta(prev.get(name) if prev else None, cur.get(name))
        rates[key] = None if d is None or not dt or dt <= 0 else d / dt
    dq = counter_delta(prev.get(PREFIX_QUERIES) if prev else None, cur.get(PREFIX_QUERIES))
    dh = counter_delta(prev.get(PREFIX_HITS) if prev else None, cur.get(PREFIX_HITS))
    hit, life_hit = hit_rates(dh, dq, cur.get(PREFIX_HITS), cur.get(PREFIX_QUERIES))
    dsteps = counter_delta(prev.get(STEPS) if prev else None, cur.get(STEPS))
    dstep_tokens = counter_delta(
        prev.get(STEP_TOKENS_SUM) if prev else None, cur.get(STEP_TOKENS_SUM)
    )
    per_step = tokens_per_step(dstep_tokens, dsteps, cur.get(STEP_TOKENS_SUM), cur.get(STEPS))
    latency, basis = latency_figures(cur, window)
    capacity, used = kv_tokens(cur)
    return Figures(
        running=cur.get(RUNNING),
        waiting=cur.get(WAITING),
        kv_usage=kv_usage(cur),
        kv_capacity_tokens=capacity,
        kv_used_tokens=used,
        prefix_hit_rate=hit,
        prefix_hit_rate_lifetime=life_hit,
        tokens_per_step=per_step,
        preemptions_total=cur.get(PREEMPTIONS),
        prompt_tokens_total=cur.get(PROMPT_TOKENS),
        generation_tokens_total=cur.get(GEN_TOKENS),
        requests_total=cur.get(REQUEST_SUCCESS),
        prompt_tokens_by_source=_source_fractions(cur, prev),
        waiting_by_reason=dict(cur.labelled.get(WAITING_BY_REASON, {})),
        finished_by_reason=dict(cur.labelled.get(REQUEST_SUCCESS, {})),
        engines=cur.engines or None,
        latency=latency,
        latency_basis=basis,
        **rates,
    )


def engine_readings(
    cur: MetricSamples, prev: MetricSamples | None, dt: float | None
) -> list[EngineView]:
    """Each engine's figures of one scrape (rates since ``prev``), its state not judged yet.

    The gauges and the generation and step rates of every engine label in ``cur``
    (opsctl.console.judge_state judges them)."""
    now = cur.by_engine()
    n = len(now)
    out = []
    for e, d in now.items():
        before = prev.by_engine().get(e, {}) if prev is not None else {}
        rates = []
        for name in (GEN_TOKENS, STEPS):
            delta = counter_delta(before.get(name), d.get(name))
            rates.append(None if delta is None or not dt or dt <= 0 else delta / dt)
        out.append(
            EngineView(
                engine=e,
                role=engine_role(e, n),
                running=d.get(RUNNING),
                waiting=d.get(WAITING),
                kv_usage=d.get(KV_USAGE),
                generation_tps=rates[0],
                steps_per_s=rates[1],
            )
        )
    return sorted(out, key=lambda v: engine_order(v.engine))


def hit_rates(
    d_hits: float | None, d_queries: float | None, hits: float | None, queries: float | None
) -> tuple[float | None, float | None]:
    """Prefix-cache hit rate over the interval (lifetime's without queries), and lifetime's."""
    life = ratio(hits, queries)
    return (ratio(d_hits, d_queries) if d_queries else life), life


def tokens_per_step(
    d_tokens: float | None, d_steps: float | None, tokens: float | None, steps: float | None
) -> float | None:
    """Tokens per engine step over the interval, else over the lifetime."""
    per = ratio_free(d_tokens, d_steps)
    return per if per is not None else ratio_free(tokens, steps)


def ratio_free(num: float | None, den: float | None) -> float | None:
    """``num / den`` unbounded; None without a numerator or with a zero denominator."""
    return None if num is None or not den else num / den


def latency_figures(
    cur: MetricSamples, window: MetricSamples | None
) -> tuple[dict[str, Quantiles], str]:
    """Percentiles of every latency histogram and their basis (window or lifetime).

    Over the window when it saw requests, else over the server's lifetime."""
    out: dict[str, Quantiles] = {}
    basis = "none"
    windowed = window is not None and window is not cur
    for short, name in LATENCY_HISTOGRAMS.items():
        cur_b = cur.buckets.get(name)
        if not cur_b:
            continue
        total_sum = cur.get(f"{name}_sum")
        if windowed:
            w_b, w_sum = window.buckets.get(name), window.get(f"{name}_sum")  # type: ignore[union-attr]
            out[short], in_window = _histogram_figures(True, w_b, w_sum, cur_b, total_sum)
        else:
            out[short], in_window = _histogram_figures(False, None, None, cur_b, total_sum)
        if in_window:
            basis = "window"
        elif basis == "none" and out[short].count:
            basis = "lifetime"
    return out, basis


@functools.lru_cache(maxsize=8192)
def _histogram_figures(
    windowed: bool,
    window_b: Buckets | None,
    window_sum: float | None,
    cur_b: Buckets,
    total_sum: float | None,
) -> tuple[Quantiles, bool]:
    """One histogram's percentiles over the window (True: it saw requests there), else
    over the lifetime. Cached on its inputs: a histogram that did not move between two
    polls (an idle server's; under load, the families the workload does not touch) costs
    a hash of its buckets, not their maths."""
    if windowed:
        delta = bucket_delta(window_b, cur_b)
        if delta and delta[-1][1] > 0:
            return quantiles(delta, counter_delta(window_sum, total_sum)), True
    return quantiles(cur_b, total_sum), False


def is_vllm(samples: MetricSamples | None) -> bool:
    """Whether a scrape's samples came from a vLLM server (any vllm: series)."""
    return samples is not None and samples.vllm_series > 0
