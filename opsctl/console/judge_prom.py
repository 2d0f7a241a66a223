"""Prometheus HTTP API (pure): the PromQL the console sends and the parsing of answers.

JSON documents in, frozen values out; no I/O. opsctl.console.judge_prom_view turns the
parsed values into the console's views.

One poll is three requests (ten with the latency ones), each serving every endpoint at
once:

- ``/api/v1/targets?state=active``: the endpoints (a job's targets), their scrape health,
  last error, last scrape time and duration; targets scraping ``/health`` (any job) give
  the health of the vLLM server with the same base URL (a 503 there is a dead engine
  whose API server may still serve /metrics);
- one instant query, the union (``or``) of every figure, each ``sum by (instance)``
  (``job, instance`` without --job) and tagged with ``opsctl_q`` by ``label_replace``:
  gauges, counters, ``rate()``/``increase()`` over the rate window, ``resets()`` and
  ``changes(process_start_time_seconds)`` over the restart hold;
- every few polls (they cost Prometheus most: every histogram bucket of every endpoint),
  one union per latency histogram: ``histogram_quantile()`` over the latency window where
  it saw requests, else over the server's lifetime;
- one range selector (raw samples of running, generation tokens, engine steps over the
  stall window plus two scrapes) for the stall rule of opsctl.console.judge_state."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from opsctl.console.judge import QUANTILES, RATES, RESET_COUNTERS
from opsctl.domain import metrics as vm
from opsctl.domain.metrics import Point

TAG = "opsctl_q"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
START_TIME = "process_start_time_seconds"
QNAMES = tuple(f"p{round(q * 100)}" for q in QUANTILES)  # p50 p90 p95 p99
# figure key -> metric, summed per endpoint
GAUGES = {
    "running": vm.RUNNING,
    "waiting": vm.WAITING,
    "kv": vm.KV_USAGE,
    "prompt_total": vm.PROMPT_TOKENS,
    "gen_total": vm.GEN_TOKENS,
    "req_total": vm.REQUEST_SUCCESS,
    "preempt_total": vm.PREEMPTIONS,
    "prefix_q": vm.PREFIX_QUERIES,
    "prefix_h": vm.PREFIX_HITS,
    "steps": vm.STEPS,
    "step_tokens": vm.STEP_TOKENS_SUM,
}
INCREASES = {"d_prefix_q": vm.PREFIX_QUERIES, "d_prefix_h": vm.PREFIX_HITS, "d_steps": vm.STEPS,
             "d_step_tokens": vm.STEP_TOKENS_SUM}  # fmt: skip
# key -> (metric, the label kept apart)
LABELLED = {
    "by_source": (vm.PROMPT_BY_SOURCE, "source"),
    "waiting_by_reason": (vm.WAITING_BY_REASON, "reason"),
    "finished": (vm.REQUEST_SUCCESS, "finished_reason"),
}
# per data-parallel engine (the ``engine`` label; a series without one is engine "0"):
# gauges summed and rates, the per-engine views' figures
ENGINE_GAUGES = {"e.running": vm.RUNNING, "e.waiting": vm.WAITING, "e.kv": vm.KV_USAGE}
ENGINE_RATES = {"e.gen_tps": vm.GEN_TOKENS, "e.steps_ps": vm.STEPS}
ENGINE_TAGS = (*ENGINE_GAUGES, *ENGINE_RATES)
ENGINE = vm.ENGINE_LABEL


class PromError(ValueError):
    """A Prometheus answer that is an error or not what the API documents."""


# ---- the queries ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Windows:
    """Range widths (seconds) of one poll's queries."""

    rate_s: float  # rates and interval ratios (the poll period, at least two scrapes)
    latency_s: float  # percentiles (the direct source's latency window)
    restart_s: float  # how long a reset shows 'restarted'
    stall_s: float  # raw samples for the stall rule (stall window + two scrapes)


def _dur(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(job: str | None) -> str:
    """The PromQL label selector of a job (``{job="..."}``; '' for every job)."""
    return f"{{job={_quote(job)}}}" if job else ""


def group_by(job: str | None) -> str:
    """The labels figures are summed by: the instance (and the job without one)."""
    return "instance" if job else "job, instance"


def figure_parts(job: str | None, w: Windows) -> list[tuple[str, str]]:
    """(tag, PromQL) of every figure but the latency percentiles.

    Each yields at most one sample per endpoint (per label value for the labelled ones)."""
    sel, by = selector(job), group_by(job)
    r, hold = _dur(w.rate_s), _dur(w.restart_s)
    parts = [("up", f"sum by ({by}) (up{sel})")]
    # when the data were scraped (the target list's lastScrape may be a newer scrape)
    parts.append(("sample_t", f"max by ({by}) (timestamp({vm.RUNNING}{sel}))"))
    # KV usage is a fraction per engine (each its own cache): the engines' mean
    parts += [
        (k, f"{'avg' if k == 'kv' else 'sum'} by ({by}) ({m}{sel})") for k, m in GAUGES.items()
    ]
    parts += [(k, f"sum by ({by}, {ENGINE}) ({m}{sel})") for k, m in ENGINE_GAUGES.items()]
    parts += [
        (k, f"sum by ({by}, {ENGINE}) (rate({m}{sel}[{r}]))") for k, m in ENGINE_RATES.items()
    ]
    parts += [(k, f"sum by ({by}) (rate({m}{sel}[{r}]))") for k, m in RATES.items()]
    parts += [(k, f"sum by ({by}) (increase({m}{sel}[{r}]))") for k, m in INCREASES.items()]
    for k, (m, label) in LABELLED.items():
        parts.append((k, f"sum by ({by}, {label}) ({m}{sel})"))
    src, src_label = LABELLED["by_source"]
    parts.append(("d_by_source", f"sum by ({by}, {src_label}) (increase({src}{sel}[{r}]))"))
    # one part per counter: resets() drops the metric name, so one selector over several
    # counters would give equal label sets
    for i, m in enumerate(RESET_COUNTERS):
        parts.append((f"resets.{i}", f"sum by ({by}) (resets({m}{sel}[{hold}]))"))
    parts.append(("starts", f"sum by ({by}) (changes({START_TIME}{sel}[{hold}]))"))
    parts.append(("models", f"count by ({by}, model_name) ({vm.RUNNING}{sel})"))
    parts.append(("engines", f"count by ({by}) (count by ({by}, engine) ({vm.RUNNING}{sel}))"))
    parts.append(
        ("cache", f"max by ({by}, num_gpu_blocks, block_size) ({vm.CACHE_CONFIG_INFO}{sel})")
    )
    return parts


def latency_parts(job: str | None, w: Windows, short: str) -> list[tuple[str, str]]:
    """(tag, PromQL) of one latency histogram: counts, sums and quantiles.

    Of one latency histogram: observations and sum over the latency window (count
    only where > 0), lifetime count and sum, each quantile over the window (where it
    saw requests: NaN is dropped by ``>= 0``) and over the lifetime (only where the
    window saw none)."""
    sel, by, lw = selector(job), group_by(job), _dur(w.latency_s)
    h = vm.LATENCY_HISTOGRAMS[short]
    seen = f"(sum by ({by}) (increase({h}_count{sel}[{lw}])) > 0)"
    out = [
        (f"wc.{short}", seen),
        (f"ws.{short}", f"sum by ({by}) (increase({h}_sum{sel}[{lw}]))"),
        (f"lc.{short}", f"sum by ({by}) ({h}_count{sel})"),
        (f"ls.{short}", f"sum by ({by}) ({h}_sum{sel})"),
    ]
    window = f"sum by ({by}, le) (rate({h}_bucket{sel}[{lw}]))"
    life = f"sum by ({by}, le) ({h}_bucket{sel})"
    for q, name in zip(QUANTILES, QNAMES, strict=True):
        out.append((f"qw.{short}.{name}", f"histogram_quantile({q}, {window}) >= 0"))
        out.append(
            (f"ql.{short}.{name}", f"histogram_quantile({q}, {life}) >= 0 unless on ({by}) {seen}")
        )
    return out


def union(parts: list[tuple[str, str]]) -> str:
    """One instant query of many parts, each tagged with its key (``opsctl_q``)."""
    return " or ".join(f'label_replace({expr}, "{TAG}", "{key}", "", "")' for key, expr in parts)


def figures_query(job: str | None, w: Windows) -> str:
    """The one instant query of every figure but latency: a union of tagged parts."""
    return union(figure_parts(job, w))


def latency_queries(job: str | None, w: Windows) -> list[str]:
    """One query per latency histogram (sent concurrently).

    Sent concurrently, Prometheus evaluates them on several cores (one query's
    evaluation is mostly one goroutine)."""
    return [union(latency_parts(job, w, short)) for short in vm.LATENCY_HISTOGRAMS]


def stall_query(job: str | None, w: Windows) -> str:
    """The range query of the stall series' raw samples over the stall window."""
    names = "|".join(re.escape(n) for n in vm.STALL_SERIES)
    job_part = f", job={_quote(job)}" if job else ""
    return f'{{__name__=~"{names}"{job_part}}}[{_dur(w.stall_s)}]'


# ---- parsing --------------------------------------------------------------------------------


def data_of(doc: Any, result_type: str | None = None) -> Any:
    """The ``data`` of a successful answer; PromError with Prometheus's own words else."""
    if not isinstance(doc, dict):
        raise PromError("not a Prometheus API answer (no JSON object)")
    if doc.get("status") != "success":
        raise PromError(f"Prometheus: {doc.get('errorType', 'error')}: {doc.get('error', doc)}")
    data = doc.get("data")
    if result_type is not None:
        if not isinstance(data, dict) or data.get("resultType") != result_type:
            got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            raise PromError(f"Prometheus answered a {got}, not a {result_type}")
        return data.get("result") or []
    return data


def number(text: Any) -> float | None:
    """A sample value ("12", "NaN", "+Inf") as a float; NaN and bad values are None."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def parse_duration(text: Any) -> float | None:
    """Prometheus durations: "1s", "500ms", "1m30s", "2h"."""
    if not isinstance(text, str) or not text:
        return None
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    return total if pos == len(text) else None


def parse_time(text: Any) -> float | None:
    """RFC 3339 time as epoch seconds; None for Prometheus's zero time.

    Prometheus's lastScrape, nanoseconds allowed; its zero time marks a target never
    scraped."""
    if not isinstance(text, str) or not text:
        return None
    m = re.match(r"^(.*?T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        return None
    frac = (m.group(2) or "")[:7]  # datetime takes microseconds
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        t = datetime.fromisoformat(m.group(1) + frac + zone).timestamp()
    except ValueError:
        return None
    return t if t > 0 else None


@dataclass(frozen=True, slots=True)
class PromTarget:
    """One active Prometheus target."""

    job: str
    instance: str
    url: str  # base URL: the scrape URL without its /metrics or /health path
    path: str  # the scrape path
    labels: tuple[tuple[str, str], ...]  # the target's labels but instance
    health: str  # up | down | unknown
    last_error: str
    last_scrape: float | None
    scrape_s: float | None  # how long the last scrape took
    interval_s: float | None

    @property
    def is_health(self) -> bool:
        """Whether this target scrapes a server's /health (not its /metrics)."""
        return self.path.rstrip("/").endswith(HEALTH_PATH)


def base_url(scrape_url: str) -> tuple[str, str]:
    """(base URL, path) of a scrape URL: query dropped, /metrics or /health cut off."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]+)([^?#]*)", scrape_url)
    if not m:
        return scrape_url, ""
    root, path = m.group(1), m.group(2)
    scheme, _, host = root.partition("://")
    root = f"{scheme.lower()}://{host.lower()}"
    for tail in (METRICS_PATH, HEALTH_PATH):
        if path.rstrip("/").endswith(tail):
            return root + path.rstrip("/")[: -len(tail)], path
    return root + path.rstrip("/"), path


def parse_targets(doc: Any) -> list[PromTarget]:
    """The active targets of a /api/v1/targets answer."""
    data = data_of(doc)
    items = data.get("activeTargets") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise PromError("Prometheus targets answer has no activeTargets list")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("labels"), dict):
            continue
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        url, path = base_url(str(item.get("scrapeUrl") or ""))
        out.append(
            PromTarget(
                job=labels.get("job", str(item.get("scrapePool") or "")),
                instance=labels.get("instance", url),
                url=url,
                path=path,
                labels=tuple(sorted((k, v) for k, v in labels.items() if k != "instance")),
                health=str(item.get("health") or "unknown"),
                last_error=str(item.get("lastError") or ""),
                last_scrape=parse_time(item.get("lastScrape")),
                scrape_s=number(item.get("lastScrapeDuration")),
                interval_s=parse_duration(item.get("scrapeInterval")),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class InstanceData:
    """One endpoint's answer to the instant query: tag -> value, labelled tags, labels.

    Labelled tags map tag -> label value -> value; tags with labels of their own
    (models, cache) keep them in ``labels``."""

    scalars: dict[str, float | None]
    labelled: dict[str, dict[str, float]]
    models: tuple[str, ...]
    cache: dict[str, str]

    def get(self, key: str) -> float | None:
        """The value of one tag; None when Prometheus returned none."""
        return self.scalars.get(key)

    def with_scalars(self, more: dict[str, float | None] | None) -> InstanceData:
        """These figures plus ``more`` (the latency ones of another query)."""
        if not more:
            return self
        return InstanceData({**more, **self.scalars}, self.labelled, self.models, self.cache)


Key = tuple[str, str]  # (job, instance)


def _key(metric: dict, job: str | None) -> Key:
    return (str(metric.get("job", job or "")), str(metric.get("instance", "")))


def group_results(result: list, job: str | None) -> dict[Key, InstanceData]:
    """Split the tagged instant vector by endpoint (job, instance)."""
    scalars: dict[Key, dict[str, float | None]] = {}
    labelled: dict[Key, dict[str, dict[str, float]]] = {}
    models: dict[Key, list[str]] = {}
    cache: dict[Key, dict[str, str]] = {}
    label_of = {k: label for k, (_, label) in LABELLED.items()}
    label_of["d_by_source"] = LABELLED["by_source"][1]
    for item in result:
        metric = item.get("metric") or {}
        tag = metric.get(TAG)
        value = item.get("value") or (None, None)
        if tag is None:
            continue
        k = _key(metric, job)
        scalars.setdefault(k, {})
        v = number(value[1])
        if tag in ENGINE_TAGS:  # a series without an engine label is engine "0"
            if v is not None:
                labelled.setdefault(k, {}).setdefault(tag, {})[str(metric.get(ENGINE, "0"))] = v
        elif tag == "models":
            models.setdefault(k, []).append(str(metric.get("model_name", "")))
        elif tag == "cache":
            cache[k] = {n: str(metric[n]) for n in ("num_gpu_blocks", "block_size") if n in metric}
        elif tag in label_of:
            if v is not None and label_of[tag] in metric:
                labelled.setdefault(k, {}).setdefault(tag, {})[str(metric[label_of[tag]])] = v
        else:
            scalars[k][tag] = v
    return {
        k: InstanceData(s, labelled.get(k, {}), tuple(sorted(models.get(k, []))), cache.get(k, {}))
        for k, s in scalars.items()
    }


EnginePoints = dict[str, list[Point]]  # engine label -> its points, in time order


def stall_points(result: list, job: str | None) -> dict[Key, EnginePoints]:
    """Raw stall-series samples summed per endpoint, engine and scrape time, in time order.

    The engine is the data-parallel ``engine`` label (none is engine "0"); every series
    of one scrape carries the same timestamp. The stall rule is each engine's."""
    col = {name: i for i, name in enumerate(vm.STALL_SERIES, 1)}
    per: dict[Key, dict[str, dict[float, list[float]]]] = {}
    for item in result:
        metric = item.get("metric") or {}
        i = col.get(str(metric.get("__name__")))
        if i is None:
            continue
        engine = str(metric.get(ENGINE, "0"))
        rows = per.setdefault(_key(metric, job), {}).setdefault(engine, {})
        for t, text in item.get("values") or []:
            v = number(text)
            row = rows.setdefault(float(t), [float(t), *(0.0 for _ in vm.STALL_SERIES)])
            row[i] += v or 0.0
    return {
        k: {
            e: [(r[0], r[1], r[2], r[3], r[4]) for _, r in sorted(rows.items())]
            for e, rows in engines.items()
        }
        for k, engines in per.items()
    }


def jobs_with_vllm(data: dict[Key, InstanceData]) -> set[str]:
    """The jobs of which some endpoint exports vLLM series."""
    return {k[0] for k, d in data.items() if d.models}


# ---- the blackbox canary's probes (opsctl rules --blackbox-out) -------------------------------

# key -> (metric, extra matcher)
PROBE_FIGURES = {
    "success": ("probe_success", ""),
    "seconds": ("probe_duration_seconds", ""),
    "status": ("probe_http_status_code", ""),
    "connect": ("probe_http_duration_seconds", 'phase="connect"'),
}


@dataclass(frozen=True, slots=True)
class Probe:
    """The blackbox exporter's last canary probe of one vLLM server (its host:port)."""

    instance: str
    success: bool
    seconds: float | None  # how long the probe took
    status: int | None  # the HTTP status it got; 0 or None: no answer (timeout, refused)
    at: float | None  # when Prometheus scraped it (epoch seconds)
    connected: bool = True  # the connection was made (a refused one: False)


def canary_query(job: str) -> str:
    """The last probe of every target of the canary scrape ``job``, one tagged series each."""
    job_sel = f"job={_quote(job)}"
    parts = []
    for tag, (m, extra) in PROBE_FIGURES.items():
        parts.append((tag, f"{m}{{{', '.join(x for x in (job_sel, extra) if x)}}}"))
    return union(parts)


def parse_probes(result: list) -> dict[str, Probe]:
    """The canary query's answer as one Probe per instance (those without a success: none)."""
    seen: dict[str, dict[str, float | None]] = {}
    at: dict[str, float | None] = {}
    for item in result if isinstance(result, list) else []:
        metric, value = item.get("metric") or {}, item.get("value") or [None, None]
        inst, tag = metric.get("instance"), metric.get(TAG)
        if not inst or tag not in PROBE_FIGURES:
            continue
        seen.setdefault(inst, {})[tag] = number(value[1])
        at[inst] = number(value[0])
    out = {}
    for inst, f in seen.items():
        success = f.get("success")
        if success is None:
            continue
        status = f.get("status")
        connect = f.get("connect")
        out[inst] = Probe(inst, success >= 1, f.get("seconds"),
                          None if status is None else int(status), at[inst],
                          connect is None or connect > 0)  # fmt: skip
    return out
