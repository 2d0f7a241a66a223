"""Key serving metrics derived from two /metrics snapshots (rates need a previous one)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    taken_at: float
    # vllm:* sample name -> value summed over label sets (e.g. over model_name)
    values: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_metrics(text: str, taken_at: float | None = None) -> MetricsSnapshot:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:"):
                continue
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return MetricsSnapshot(taken_at if taken_at is not None else time.time(), values)


RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GEN_TOKENS = "vllm:generation_tokens_total"
# vllm:iteration_tokens_total is observed once per engine step: its count counts steps
STEPS = "vllm:iteration_tokens_total_count"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"


@dataclass(frozen=True, slots=True)
class KeyMetrics:
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
