"""The console's advisor (pure): live figures in, tuning findings out.

Every finding has a stable ``code``, a ``severity`` (opsctl.domain.findings: fail,
warning, info), a one-line ``message``, the ``figures`` that triggered it (with the
window they were taken over: ``window_s``) and ``next``, the command to run next.

Codes: vllmstat 0.9.1's advisor codes that vLLM's metrics support, with its thresholds
(vllmstat/core/advisor.py) -- ``kv_preemption``, ``output_truncation``,
``request_errors``, ``context_overprovisioned``, ``gpu_mem_under``, ``queue_backlog``,
``spec_ineffective``, ``gpu_thermal``, ``prefix_caching_off`` -- and opsctl's own:
``stalled``, ``restarted``, ``unauthorized``, ``patch_failed``, ``test_knob_active``,
``dp_imbalance`` (a server's data-parallel engines unevenly loaded: vllm-doctor's
replica-imbalance signals, per engine of one server).

Windows, not lifetimes: counters are read as their increase over a :class:`Window` of
live scrapes (the console's latency window, or what ``--once`` watched), so an old burst
of preemptions, truncations or errors ages out of the window and its finding goes away.
vllmstat reads finish reasons over one interval and the queue's session peak; here both
are over the window. Gauges (waiting, GPU temperature and power) are read over the
window or as they are now; configuration (vllm:cache_config_info labels) has no window
(``window_s`` null, ``source`` names the label).

Findings do not change the console's exit code (that is the endpoints' states)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opsctl.console.judge import RESTARTED, STALLED, UNAUTHORIZED, EndpointView
from opsctl.console.judge_endpoint_notes import Advice
from opsctl.domain import knobs
from opsctl.domain.alert_rules import ERROR_RATIO as REQUEST_ERRORS_MIN_FRACTION
from opsctl.domain.alert_rules import KV_PREEMPTION_MIN_PER_S
from opsctl.domain.findings import FAIL, INFO, WARNING
from opsctl.domain.metrics import (
    CACHE_CONFIG_INFO,
    GEN_LEN,
    PREEMPTIONS,
    PROMPT_LEN,
    REQUEST_SUCCESS,
    SPEC_ACCEPTED,
    SPEC_DRAFT_TOKENS,
    WAITING,
    Buckets,
    MetricSamples,
    bucket_delta,
)

# ---- thresholds (vllmstat 0.9.1 core/advisor.py unless said) --------------------------------
# kv_preemption and request_errors are the console's side of the alerts VllmKvCacheSaturated
# and VllmRequestErrors: one threshold each, in opsctl.domain.alert_rules (windows agree:
# RATE_WINDOW_S 60 s = the console's latency window the advisor reads). queue_backlog (a
# peak of 2 waiting: a tuning hint) is not VllmQueueBacklog (a queue growing for 120 s:
# a page).
# a share of finished requests says something only over enough of them: a window that saw
# one request (the console's 1-token canary, finished at its length cap, a 1-word
# prompt) is no evidence of truncation or of an over-sized context
SHARES_MIN_FINISHED = 10.0
TRUNCATION_WARNING_FRACTION = 0.20  # finished at the length cap (of finished in the window)
TRUNCATION_FAIL_FRACTION = 0.50
CONTEXT_OVERPROVISIONED_FRACTION = 0.50  # largest request below this share of max_model_len
GPU_MEM_UTIL_LOW = 0.85  # --gpu-memory-utilization below this: KV cache left unclaimed
QUEUE_BACKLOG_MIN_WAITING = 2.0  # peak requests waiting in the window
SPEC_ACCEPTANCE_LOW = 0.30  # accepted / drafted tokens in the window
# dp_imbalance (opsctl's; issue 44): the data-parallel engines of one server unevenly
# loaded. vLLM routes each request to the engine with the least (waiting, running) load
# unless a router pins it (X-data-parallel-rank), so a queue on one engine while another
# has none, or KV caches far apart, means pinned routing, cache affinity or a slow or
# stuck engine. The queue signal is vllm-doctor's "waiting skew" (queued requests on one
# replica, none on another) held to opsctl's queue_backlog minimum of 2 waiting, so one
# request caught between two scrapes does not fire; the KV signal is vllm-doctor's cache
# gap of 0.30 (vllm-htop flags 15 points, a display hint: on a small cache one long
# request moves an engine 15 points)
DP_IMBALANCE_MIN_WAITING = QUEUE_BACKLOG_MIN_WAITING
DP_IMBALANCE_KV_GAP = 0.30
GPU_TEMP_HOT_C = 85.0
GPU_POWER_NEAR_LIMIT_FRACTION = 0.98

# ---- codes ----------------------------------------------------------------------------------
KV_PREEMPTION = "kv_preemption"
OUTPUT_TRUNCATION = "output_truncation"
REQUEST_ERRORS = "request_errors"
CONTEXT_OVERPROVISIONED = "context_overprovisioned"
GPU_MEM_UNDER = "gpu_mem_under"
QUEUE_BACKLOG = "queue_backlog"
DP_IMBALANCE = "dp_imbalance"
SPEC_INEFFECTIVE = "spec_ineffective"
GPU_THERMAL = "gpu_thermal"
PREFIX_CACHING_OFF = "prefix_caching_off"
STALLED_CODE = "stalled"
RESTARTED_CODE = "restarted"
UNAUTHORIZED_CODE = "unauthorized"
PATCH_FAILED = "patch_failed"
TEST_KNOB_ACTIVE = "test_knob_active"
CODES = (
    STALLED_CODE,
    UNAUTHORIZED_CODE,
    PATCH_FAILED,
    RESTARTED_CODE,
    TEST_KNOB_ACTIVE,
    KV_PREEMPTION,
    OUTPUT_TRUNCATION,
    REQUEST_ERRORS,
    QUEUE_BACKLOG,
    DP_IMBALANCE,
    GPU_THERMAL,
    CONTEXT_OVERPROVISIONED,
    GPU_MEM_UNDER,
    SPEC_INEFFECTIVE,
    PREFIX_CACHING_OFF,
)
_RANK = {FAIL: 0, WARNING: 1, INFO: 2}


@dataclass(frozen=True, slots=True)
class Window:
    """Counter increases over the live scrapes of the last ``window_s`` seconds."""

    window_s: float  # from the first scrape in the window to the last
    scrapes: int
    preemptions: float | None = None
    finished: dict[str, float] = field(default_factory=dict)  # finished_reason -> increase
    peak_waiting: float | None = None
    max_prompt_tokens: float | None = None  # bucket bound of the longest prompt seen
    max_output_tokens: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    config: dict[str, str] = field(default_factory=dict)  # vllm:cache_config_info labels


@dataclass(frozen=True, slots=True)
class LocalFacts:
    """What an opsctl run's ledger says (the console reads it; None/empty: not a run)."""

    failed_patches: tuple[str, ...] = ()  # "name (role pid N): reason"
    knobs: dict[str, str] = field(default_factory=dict)


# ---- windows --------------------------------------------------------------------------------


def _delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return max(0.0, b - a)


def max_bound(buckets: Buckets | None) -> float | None:
    """The upper bound of the highest bucket with observations (None without any).

    vllmstat's histogram_max_le; inf when some observations fell above every bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= total:
            return le
    return buckets[-1][0]


def _labelled_delta(first: MetricSamples, last: MetricSamples, name: str) -> dict[str, float]:
    before = first.labelled.get(name, {})
    return {k: max(0.0, v - before.get(k, 0.0)) for k, v in last.labelled.get(name, {}).items()}


def window_of(points: Sequence[tuple[float, MetricSamples]]) -> Window | None:
    """The window of live ``points`` (oldest first); None without a point.

    ``points`` are (time, samples) of one server lifetime: the console clears its window
    when counters go back. One point is a window of 0 s (its counters increased by
    nothing yet)."""
    if not points:
        return None
    (t0, first), (t1, last) = points[0], points[-1]
    waiting = [w for _, s in points if (w := s.get(WAITING)) is not None]
    prompt = bucket_delta(first.buckets.get(PROMPT_LEN), last.buckets.get(PROMPT_LEN) or ())
    output = bucket_delta(first.buckets.get(GEN_LEN), last.buckets.get(GEN_LEN) or ())
    return Window(
        window_s=max(0.0, t1 - t0),
        scrapes=len(points),
        preemptions=_delta(first.get(PREEMPTIONS), last.get(PREEMPTIONS)),
        finished=_labelled_delta(first, last, REQUEST_SUCCESS),
        peak_waiting=max(waiting) if waiting else None,
        max_prompt_tokens=max_bound(prompt),
        max_output_tokens=max_bound(output),
        spec_draft_tokens=_delta(first.get(SPEC_DRAFT_TOKENS), last.get(SPEC_DRAFT_TOKENS)),
        spec_accepted_tokens=_delta(first.get(SPEC_ACCEPTED), last.get(SPEC_ACCEPTED)),
        config=dict(last.info),
    )


# ---- the rules ------------------------------------------------------------------------------


def _ws(w: Window) -> float:
    return round(w.window_s, 2)


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _bool_label(v: str | None) -> bool | None:
    if v is None:
        return None
    return {"true": True, "false": False}.get(v.strip().lower())


def _float_label(v: str | None) -> float | None:
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


def console_cmd(view: EndpointView) -> str:
    """The console command that watches this endpoint (a finding's default next step)."""
    return f"opsctl console {view.target.url}"


def run_name(view: EndpointView) -> str | None:
    """The name of the endpoint's opsctl run (its run directory's last part), if any."""
    rd = view.target.run_dir
    return rd.rstrip("/").rsplit("/", 1)[-1] if rd else None


def kv_preemption(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: the engine preempts requests for lack of KV cache."""
    f = view.figures
    if w is not None and w.preemptions is not None and w.window_s > 0:
        rate, n, window_s = w.preemptions / w.window_s, w.preemptions, _ws(w)
    elif f.preemption_rate is not None:  # no window of scrapes (Prometheus): last interval
        rate, n, window_s = f.preemption_rate, None, None
    else:
        return None
    if rate < KV_PREEMPTION_MIN_PER_S:
        return None
    return Advice(
        KV_PREEMPTION,
        WARNING,
        f"KV cache exhausted: {rate:.2f} preemptions/s; running requests are evicted and "
        "recomputed. Lower --max-model-len/--max-num-seqs or give the KV cache more memory",
        {
            "preemptions_per_s": round(rate, 3),
            "preemptions": n,
            "kv_cache_usage": f.kv_usage,
            "window_s": window_s,
            "threshold_per_s": KV_PREEMPTION_MIN_PER_S,
        },
        console_cmd(view),
    )


def _finished(w: Window | None) -> tuple[float, dict[str, float]]:
    if w is None:
        return 0.0, {}
    return sum(w.finished.values()), w.finished


def output_truncation(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: too many requests in the window stopped at their length limit."""
    total, by = _finished(w)
    if total < SHARES_MIN_FINISHED or w is None:
        return None
    frac = by.get("length", 0.0) / total
    if frac < TRUNCATION_WARNING_FRACTION:
        return None
    fail = frac >= TRUNCATION_FAIL_FRACTION
    return Advice(
        OUTPUT_TRUNCATION,
        WARNING if fail else INFO,
        f"{_pct(frac)} of requests finished at the length cap: completions are cut off. "
        "Raise max_tokens (clients) or --max-model-len",
        {
            "length_fraction": round(frac, 4),
            "length_finished": by.get("length", 0.0),
            "finished": total,
            "window_s": _ws(w),
            "threshold_fraction": TRUNCATION_FAIL_FRACTION if fail else TRUNCATION_WARNING_FRACTION,
        },
        console_cmd(view),
    )


def request_errors(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: a share of the window's finished requests ended in an error."""
    total, by = _finished(w)
    errors = by.get("error", 0.0)
    if total <= 0 or w is None or errors <= 0:
        return None
    frac = errors / total
    if frac < REQUEST_ERRORS_MIN_FRACTION:
        return None
    nxt = f"opsctl runs bundle {run_name(view)}" if run_name(view) else console_cmd(view)
    return Advice(
        REQUEST_ERRORS,
        WARNING,
        f"{_pct(frac)} of requests ended in error: read the server's log",
        {
            "error_fraction": round(frac, 4),
            "errors": errors,
            "finished": total,
            "window_s": _ws(w),
            "threshold_fraction": REQUEST_ERRORS_MIN_FRACTION,
        },
        nxt,
    )


def context_overprovisioned(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: the longest request uses a small part of max_model_len."""
    model = view.info.models[0] if view.info.models else None
    mml = model.max_model_len if model else None
    if not mml or w is None or w.max_prompt_tokens is None or w.max_output_tokens is None:
        return None
    if _finished(w)[0] < SHARES_MIN_FINISHED:
        return None
    largest = w.max_prompt_tokens + w.max_output_tokens
    frac = largest / mml
    if frac >= CONTEXT_OVERPROVISIONED_FRACTION:
        return None
    return Advice(
        CONTEXT_OVERPROVISIONED,
        INFO,
        f"context over-provisioned: the largest request (about {largest:,.0f} tokens) is "
        f"{_pct(frac)} of max_model_len {mml:,}. A smaller --max-model-len frees KV cache",
        {
            "largest_request_tokens": largest,
            "max_prompt_tokens": w.max_prompt_tokens,
            "max_output_tokens": w.max_output_tokens,
            "max_model_len": mml,
            "window_s": _ws(w),
            "threshold_fraction": CONTEXT_OVERPROVISIONED_FRACTION,
        },
        console_cmd(view),
    )


def gpu_mem_under(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: --gpu-memory-utilization is set low on an engine seen on a GPU.

    Only where the console saw the engine on a GPU: vLLM on CPU reports a
    gpu_memory_utilization too (its KV cache is VLLM_CPU_KVCACHE_SPACE)."""
    util = _float_label(w.config.get("gpu_memory_utilization")) if w else None
    gpus = getattr(view, "gpus", ())
    if util is None or not gpus or util >= GPU_MEM_UTIL_LOW:
        return None
    return Advice(
        GPU_MEM_UNDER,
        INFO,
        f"GPU memory under-committed: --gpu-memory-utilization {util:g}; more gives vLLM "
        "more KV cache (concurrency, longer context)",
        {
            "gpu_memory_utilization": util,
            "gpus": [g.index for g in gpus],
            "window_s": None,
            "source": CACHE_CONFIG_INFO,
            "threshold": GPU_MEM_UTIL_LOW,
        },
        console_cmd(view),
    )


def queue_backlog(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: requests waited in the queue (peak over the window)."""
    if w is not None and w.peak_waiting is not None:
        peak, window_s = w.peak_waiting, _ws(w)
    elif view.figures.waiting is not None:
        peak, window_s = view.figures.waiting, None
    else:
        return None
    if peak < QUEUE_BACKLOG_MIN_WAITING:
        return None
    return Advice(
        QUEUE_BACKLOG,
        INFO,
        f"queue backlog: up to {peak:.0f} requests waiting. Raise --max-num-seqs or add a replica",
        {
            "peak_waiting": peak,
            "waiting_now": view.figures.waiting,
            "window_s": window_s,
            "threshold": QUEUE_BACKLOG_MIN_WAITING,
        },
        console_cmd(view),
    )


def dp_imbalance(view: EndpointView) -> Advice | None:
    """Finding: a server's data-parallel engines unevenly loaded (queue or KV cache).

    Read from each engine's gauges as they are now (``window_s`` null): requests waiting
    on one engine (DP_IMBALANCE_MIN_WAITING or more) while another has an empty queue,
    or KV cache usages DP_IMBALANCE_KV_GAP or more apart. Only for a server of several
    engines (the ``engine`` label)."""
    engines = view.engines
    if len(engines) < 2:
        return None
    waiting = {e.engine: e.waiting for e in engines if e.waiting is not None}
    kv = {e.engine: e.kv_usage for e in engines if e.kv_usage is not None}
    queued = [k for k, n in waiting.items() if n >= DP_IMBALANCE_MIN_WAITING]
    empty = [k for k, n in waiting.items() if n == 0]
    gap = max(kv.values()) - min(kv.values()) if len(kv) > 1 else 0.0
    parts = []
    if queued and empty:
        most = max(queued, key=lambda k: waiting[k])
        parts.append(
            f"engine {most} has {waiting[most]:.0f} requests waiting while engine "
            f"{empty[0]} has none"
        )
    if gap >= DP_IMBALANCE_KV_GAP:
        hi, lo = max(kv, key=lambda k: kv[k]), min(kv, key=lambda k: kv[k])
        parts.append(
            f"KV cache {_pct(kv[hi])} on engine {hi} vs {_pct(kv[lo])} on engine {lo} "
            f"({gap * 100:.0f} points apart)"
        )
    if not parts:
        return None
    return Advice(
        DP_IMBALANCE,
        WARNING,
        f"data-parallel engines unevenly loaded: {'; '.join(parts)}. vLLM sends each "
        "request to its least loaded engine unless a router pins X-data-parallel-rank: "
        "check the router's pinning and prefix affinity, and whether one engine is slow or stuck",
        {
            "engines": len(engines),
            "waiting_by_engine": waiting,
            "kv_usage_by_engine": {k: round(v, 4) for k, v in kv.items()},
            "kv_gap": round(gap, 4),
            "window_s": None,  # the gauges now
            "threshold_waiting": DP_IMBALANCE_MIN_WAITING,
            "threshold_kv_gap": DP_IMBALANCE_KV_GAP,
        },
        f"opsctl status {view.target.url}",
    )


def spec_ineffective(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: speculative decoding's acceptance rate is low."""
    if w is None or not w.spec_draft_tokens or w.spec_accepted_tokens is None:
        return None
    acceptance = w.spec_accepted_tokens / w.spec_draft_tokens
    if acceptance >= SPEC_ACCEPTANCE_LOW:
        return None
    return Advice(
        SPEC_INEFFECTIVE,
        INFO,
        f"speculative decoding accepts {_pct(acceptance)} of drafted tokens: mostly "
        "overhead. Try a better draft model or turn it off",
        {
            "acceptance": round(acceptance, 4),
            "draft_tokens": w.spec_draft_tokens,
            "accepted_tokens": w.spec_accepted_tokens,
            "window_s": _ws(w),
            "threshold": SPEC_ACCEPTANCE_LOW,
        },
        console_cmd(view),
    )


def gpu_thermal(view: EndpointView) -> list[Advice]:
    """Findings: a GPU of the endpoint runs hot or near its power limit."""
    out = []
    for g in getattr(view, "gpus", ()):
        hot = g.temp_c is not None and g.temp_c >= GPU_TEMP_HOT_C
        near = bool(
            g.power_w
            and g.power_limit_w
            and g.power_w >= GPU_POWER_NEAR_LIMIT_FRACTION * g.power_limit_w
        )
        if not (hot or near):
            continue
        temp = "-" if g.temp_c is None else f"{g.temp_c:.0f} C"
        power = f"{g.power_w:.0f} W of {g.power_limit_w:.0f} W" if near else "power below limit"
        out.append(
            Advice(
                GPU_THERMAL,
                WARNING,
                f"GPU {g.index} near its limit: {temp}, {power}; it may throttle",
                {
                    "gpu": g.index,
                    "temp_c": g.temp_c,
                    "power_w": g.power_w,
                    "power_limit_w": g.power_limit_w,
                    "window_s": None,  # the reading now
                    "threshold_temp_c": GPU_TEMP_HOT_C,
                    "threshold_power_fraction": GPU_POWER_NEAR_LIMIT_FRACTION,
                },
                console_cmd(view),
            )
        )
    return out


def prefix_caching_off(view: EndpointView, w: Window | None) -> Advice | None:
    """Finding: the server runs with prefix caching off."""
    enabled = _bool_label(w.config.get("enable_prefix_caching")) if w else None
    if enabled is not False:
        return None
    return Advice(
        PREFIX_CACHING_OFF,
        INFO,
        "prefix caching is off: turning it on (--enable-prefix-caching) speeds up shared "
        "prefixes (system prompts, few-shot, multi-turn chats)",
        {"enable_prefix_caching": False, "window_s": None, "source": CACHE_CONFIG_INFO},
        console_cmd(view),
    )


def local_findings(view: EndpointView, local: LocalFacts | None) -> list[Advice]:
    """Findings from the run's ledger: failed patches and active test knobs."""
    if local is None:
        return []
    run = run_name(view)
    nxt = f"opsctl patches --run {run}" if run else console_cmd(view)
    out = []
    if local.failed_patches:
        n = len(local.failed_patches)
        out.append(
            Advice(
                PATCH_FAILED,
                FAIL,
                f"{n} patch{'es' if n != 1 else ''} failed in this run's ledger: "
                + "; ".join(local.failed_patches[:3]),
                {"failed_patches": list(local.failed_patches), "window_s": None},
                nxt,
            )
        )
    warning = knobs.warning(local.knobs)  # the line every diag report shows on top
    if warning:
        out.append(
            Advice(
                TEST_KNOB_ACTIVE,
                WARNING,
                warning,
                {"knobs": dict(local.knobs), "window_s": None},
                nxt,
            )
        )
    return out


def window_findings(
    view: EndpointView, w: Window | None, local: LocalFacts | None = None
) -> tuple[Advice, ...]:
    """The findings from figures (everything but the endpoint's state)."""
    found: list[Advice | None] = [
        kv_preemption(view, w),
        output_truncation(view, w),
        request_errors(view, w),
        queue_backlog(view, w),
        dp_imbalance(view),
        context_overprovisioned(view, w),
        gpu_mem_under(view, w),
        spec_ineffective(view, w),
        prefix_caching_off(view, w),
    ]
    out = [a for a in found if a is not None] + gpu_thermal(view) + local_findings(view, local)
    return tuple(out)


def state_findings(view: EndpointView) -> list[Advice]:
    """Findings from the endpoint's state: stalled, restarted, unauthorized.

    The console's state machine decides the state; its reason is the message."""
    run = run_name(view)
    bundle = f"opsctl runs bundle {run}" if run else console_cmd(view)
    figs = {"state": view.state, "restarts_seen": view.restarts, "window_s": None}
    if view.state == STALLED:
        return [Advice(STALLED_CODE, FAIL, f"stalled: {view.reason}", figs, bundle)]
    if view.state == UNAUTHORIZED:
        return [
            Advice(
                UNAUTHORIZED_CODE,
                FAIL,
                f"unauthorized: {view.reason}",
                figs,
                f"opsctl console {view.target.url} --api-key KEY",
            )
        ]
    if view.state == RESTARTED:
        return [Advice(RESTARTED_CODE, WARNING, f"restarted: {view.reason}", figs, bundle)]
    return []


def ordered(advice: Sequence[Advice]) -> tuple[Advice, ...]:
    """Most severe first, then in CODES order (stable)."""
    order = {c: i for i, c in enumerate(CODES)}
    return tuple(sorted(advice, key=lambda a: (_RANK.get(a.severity, 9), order.get(a.code, 99))))


def findings(view: EndpointView) -> tuple[Advice, ...]:
    """Every finding of an endpoint, most severe first.

    Its state's finding and the ones the console computed from its window
    (``view.findings``)."""
    return ordered([*state_findings(view), *getattr(view, "findings", ())])
