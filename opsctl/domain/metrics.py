"""Key serving metrics derived from two /metrics snapshots (rates need a previous one)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One /metrics body's vllm:* values (summed over label sets) and when it was taken."""

    taken_at: float
    # vllm:* sample name -> value summed over label sets (e.g. over model_name)
    values: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def get(self, name: str) -> float | None:
        """The summed value of one sample name; None when absent."""
        return self.values.get(name)


def parse_metrics(text: str, taken_at: float | None = None) -> MetricsSnapshot:
    """A MetricsSnapshot of a /metrics body: every vllm:* sample summed by name."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:"):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return MetricsSnapshot(taken_at if taken_at is not None else time.time(), values)


# (time, running, generation tokens, engine steps, KV cache usage): the stall rule's reading
Point = tuple[float, float, float, float, float]
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GEN_TOKENS = "vllm:generation_tokens_total"
# vllm:iteration_tokens_total is observed once per engine step: its count counts steps
STEPS = "vllm:iteration_tokens_total_count"
# the stall rule's series, in Point's order: progress is a change of any but RUNNING (a
# long prefill moves only the KV cache's usage: no step or token is published until it ends)
STALL_SERIES = (RUNNING, GEN_TOKENS, STEPS, KV_USAGE)
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"


@dataclass(frozen=True, slots=True)
class KeyMetrics:
    """The few figures a run's dashboard shows: queue, KV usage, totals, rates, TTFT."""

    running: float | None
    waiting: float | None
    kv_cache_usage: float | None  # 0..1
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    prompt_tps: float | None
    generation_tps: float | None
    ttft_mean_s: float | None  # over the last interval when it saw requests, else overall
    series: int


def _rate(cur: MetricsSnapshot, prev: MetricsSnapshot | None, name: str) -> float | None:
    if prev is None or cur.get(name) is None or prev.get(name) is None:
        return None
    dt = cur.taken_at - prev.taken_at
    if dt <= 0:
        return None
    return max(0.0, (cur.values[name] - prev.values[name]) / dt)


def key_metrics(cur: MetricsSnapshot, prev: MetricsSnapshot | None = None) -> KeyMetrics:
    """The key figures of ``cur``; rates and TTFT over the interval since ``prev``."""
    ttft = None
    s, c = cur.get(TTFT_SUM), cur.get(TTFT_COUNT)
    if s is not None and c:
        ttft = s / c
        if prev is not None and prev.get(TTFT_COUNT) is not None:
            dc = c - (prev.get(TTFT_COUNT) or 0.0)
            if dc > 0:
                ttft = (s - (prev.get(TTFT_SUM) or 0.0)) / dc
    return KeyMetrics(
        running=cur.get(RUNNING),
        waiting=cur.get(WAITING),
        kv_cache_usage=cur.get(KV_USAGE),
        prompt_tokens_total=cur.get(PROMPT_TOKENS),
        generation_tokens_total=cur.get(GEN_TOKENS),
        prompt_tps=_rate(cur, prev, PROMPT_TOKENS),
        generation_tps=_rate(cur, prev, GEN_TOKENS),
        ttft_mean_s=ttft,
        series=len(cur.values),
    )


# ---- label-aware samples and histograms (the console; additive to the API above) ----------

REQUEST_SUCCESS = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
STEP_TOKENS_SUM = "vllm:iteration_tokens_total_sum"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# the advisor's: request length histograms (context_overprovisioned), speculative decoding
PROMPT_LEN = "vllm:request_prompt_tokens"
GEN_LEN = "vllm:request_generation_tokens"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
# vllmstat's six latency histograms, by short name (vLLM 0.32 names, seconds)
LATENCY_HISTOGRAMS: dict[str, str] = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
# label breakdowns kept apart (name -> label)
LABELLED: dict[str, str] = {
    PROMPT_BY_SOURCE: "source",
    WAITING_BY_REASON: "reason",
    REQUEST_SUCCESS: "finished_reason",
}
# families the console reads; other lines are dropped before parsing (cheaper)
_WANTED = (
    RUNNING,
    WAITING,
    KV_USAGE,
    "vllm:prompt_tokens_",
    "vllm:generation_tokens_",
    "vllm:iteration_tokens_total_",
    "vllm:request_success_",
    "vllm:num_preemptions_",
    "vllm:prefix_cache_",
    CACHE_CONFIG_INFO,
    *(f"{h}_" for h in LATENCY_HISTOGRAMS.values()),
    # the advisor (opsctl.console.judge_advisor): request lengths, speculative decoding
    f"{PROMPT_LEN}_",
    f"{GEN_LEN}_",
    "vllm:spec_decode_num_",
)
Buckets = tuple[tuple[float, float], ...]  # cumulative (le, count), ascending, ends at +Inf
# the series kept per data-parallel engine (vLLM's ``engine`` label; none = engine "0"):
# the stall rule's and the per-engine views' (queue, KV usage, generation, steps)
PER_ENGINE = frozenset({RUNNING, WAITING, KV_USAGE, GEN_TOKENS, STEPS})
ENGINE_LABEL = "engine"


@dataclass(frozen=True, slots=True)
class MetricSamples:
    """One /metrics body as the console reads it: values, breakdowns, buckets, info.

    Values: vllm:* samples summed over label sets (engines, models); breakdowns: those of
    LABELLED; buckets: cumulative. ``per_engine`` holds the PER_ENGINE series per
    data-parallel engine: engine label -> name -> value summed over the other labels."""

    values: dict[str, float]
    labelled: dict[str, dict[str, float]]
    buckets: dict[str, Buckets]
    info: dict[str, str]
    engines: int
    vllm_series: int
    per_engine: dict[str, dict[str, float]] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        """The summed value of one sample name; None when absent."""
        return self.values.get(name)

    def by_engine(self) -> dict[str, dict[str, float]]:
        """``per_engine``; samples built without it (by hand) are one engine, "0"."""
        if self.per_engine:
            return self.per_engine
        one = {k: v for k, v in self.values.items() if k in PER_ENGINE}
        return {"0": one} if one else {}

    def engine_point(self, engine: str, t: float) -> Point:
        """The stall rule's reading of one engine at time ``t`` (0 for a missing series)."""
        d = self.by_engine().get(engine, {})
        running, gen, steps, kv = (d.get(name) or 0.0 for name in STALL_SERIES)
        return (t, running, gen, steps, kv)


def wanted(line: str) -> bool:
    """A sample line of a family the console reads (prefixes, no regex; no _created)."""
    return line.startswith(_WANTED) and "_created{" not in line and "_created " not in line


def filter_lines(text: str) -> str:
    """Only the sample lines of the families the console reads."""
    return "\n".join(line for line in text.splitlines() if wanted(line)) + "\n"


def count_vllm_series(text: str) -> int:
    """How many lines of a /metrics body are vllm:* samples."""
    return sum(1 for line in text.splitlines() if line.startswith("vllm:"))


def parse_samples(text: str) -> MetricSamples:
    """MetricSamples of a /metrics body by prometheus_client's parser (the reference).

    A line filter runs first; opsctl.domain.metrics_fast gives the same numbers for less
    CPU."""
    samples = (
        (s.name, s.labels, float(s.value))
        for family in text_string_to_metric_families(filter_lines(text))
        for s in family.samples
    )
    return build_samples(samples, count_vllm_series(text))


@dataclass(slots=True)
class Sums:
    """The running sums over one body's samples (build_samples and metrics_fast's alike)."""

    values: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)
    raw_buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    engines: set[str] = field(default_factory=set)
    per_engine: dict[str, dict[str, float]] = field(default_factory=dict)

    def samples(self, vllm_series: int) -> MetricSamples:
        """The sums as MetricSamples: each histogram's buckets sorted by bound."""
        buckets = {k: tuple(sorted(v.items())) for k, v in self.raw_buckets.items()}
        return MetricSamples(
            self.values,
            self.labelled,
            buckets,
            self.info,
            len(self.engines),
            vllm_series,
            self.per_engine,
        )


def build_samples(
    samples: Iterable[tuple[str, dict[str, str], float]], vllm_series: int
) -> MetricSamples:
    """MetricSamples from (name, labels, value) samples (either parser's).

    Only the families the console reads."""
    sums = Sums()
    values, labelled, raw_buckets = sums.values, sums.labelled, sums.raw_buckets
    info, engines, per_engine = sums.info, sums.engines, sums.per_engine
    for name, labels, value in samples:
        if name.endswith("_bucket") and "le" in labels:
            per = raw_buckets.setdefault(name[: -len("_bucket")], {})
            le = float(labels["le"])
            per[le] = per.get(le, 0.0) + value
            continue
        if name == CACHE_CONFIG_INFO:
            info.update(labels)
            continue
        values[name] = values.get(name, 0.0) + value
        label = LABELLED.get(name)
        if label and label in labels:
            d = labelled.setdefault(name, {})
            d[labels[label]] = d.get(labels[label], 0.0) + value
        if name in PER_ENGINE:
            d = per_engine.setdefault(labels.get(ENGINE_LABEL, "0"), {})
            d[name] = d.get(name, 0.0) + value
        if name == RUNNING:
            engines.add(labels.get(ENGINE_LABEL, "0"))
    return sums.samples(vllm_series)


def bucket_delta(prev: Buckets | None, cur: Buckets) -> Buckets | None:
    """Per-bucket increase prev -> cur; None when a count went back (a reset)."""
    if prev is None:
        return cur
    if len(prev) == len(cur):  # the usual case: the same bounds, in the same order
        out = []
        for (ple, pcount), (le, count) in zip(prev, cur, strict=True):
            d = count - pcount
            if ple != le:
                break
            if d < 0:
                return None
            out.append((le, d))
        else:
            return tuple(out)
    before = dict(prev)
    out = []
    for le, count in cur:
        d = count - before.get(le, 0.0)
        if d < 0:
            return None
        out.append((le, d))
    return tuple(out)


def histogram_quantile(buckets: Buckets | None, q: float) -> float | None:
    """Prometheus-style quantile of cumulative buckets; None without observations.

    Linear within the bucket; one that falls in +Inf gives the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= target:
            if le == float("inf"):
                return prev_le
            width = count - prev_count
            if width <= 0:
                return le
            return prev_le + (target - prev_count) / width * (le - prev_le)
        prev_le, prev_count = le, count
    return prev_le
