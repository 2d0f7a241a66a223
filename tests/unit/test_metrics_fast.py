"""The targeted /metrics tokenizer gives the same MetricSamples as prometheus_client's
parser (the reference) on recorded real vLLM bodies, on bodies with many label sets,
LoRA info and histograms, and falls back to the reference on what it does not handle."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from opsctl.collectors.scrape import MetricsCache
from opsctl.domain import metrics_fast
from opsctl.domain.metrics import LATENCY_HISTOGRAMS, build_samples, parse_samples
from opsctl.domain.metrics_fast import (
    Unsupported,
    build_prepared,
    parse_samples_fast,
    prepare,
    scan,
    tokenize,
)
from tests.standins.vllm_server import render_metrics

DATA = Path(__file__).resolve().parents[1] / "data"
# every recorded real vLLM /metrics body in tests/data
REAL_BODIES = sorted(p for p in DATA.glob("vllm_metrics_*.txt"))


def fast_only(text: str):
    """The tokenizer without its fallback: proves the fast path itself is equal (both
    builders: the reference's over tokens, and the prepared one the console uses)."""
    lines, series = scan(text)
    via_reference_builder = build_samples([tokenize(line) for line in lines], series)
    prepared = build_prepared([prepare(line) for line in lines], series)
    same(prepared, via_reference_builder)
    return prepared


def _eq(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def same(a, b) -> None:
    assert a.values.keys() == b.values.keys()
    for k in a.values:
        assert _eq(a.values[k], b.values[k])
    # the per-engine series (the stall rule per DP engine) agree too, engine by engine
    assert a.per_engine.keys() == b.per_engine.keys()
    for e, d in a.per_engine.items():
        assert d.keys() == b.per_engine[e].keys(), e
        assert all(_eq(v, b.per_engine[e][k]) for k, v in d.items()), (e, d, b.per_engine[e])
    assert a.labelled == b.labelled
    assert a.buckets == b.buckets
    assert a.info == b.info
    assert (a.engines, a.vllm_series) == (b.engines, b.vllm_series)


def test_there_are_recorded_bodies() -> None:
    assert REAL_BODIES, "no recorded vLLM /metrics body in tests/data"


@pytest.mark.parametrize("path", REAL_BODIES, ids=lambda p: p.name)
def test_real_body_same_numbers_without_fallback(path: Path) -> None:
    text = path.read_text()
    ref = parse_samples(text)
    assert ref.values and ref.buckets and ref.info  # the body exercises every kind
    assert set(LATENCY_HISTOGRAMS.values()) & set(ref.buckets)
    same(fast_only(text), ref)
    same(parse_samples_fast(text), ref)


def test_changing_counters_same_numbers() -> None:
    """The stand-in's busy bodies (the benchmark's): counters replaced poll by poll."""
    base = (DATA / "vllm_metrics_tiny_llama.txt").read_text()
    for i in range(5):
        text = render_metrics(
            base,
            {
                "vllm:num_requests_running": 4.0 + i,
                "vllm:generation_tokens_total": 737.0 + 200.25 * i,
                "vllm:iteration_tokens_total_count": 737.0 + 4 * i,
            },
        )
        ref = parse_samples(text)
        assert ref.values["vllm:generation_tokens_total"] == 737.0 + 200.25 * i
        same(fast_only(text), ref)


def _many_labels(base: str) -> str:
    """The real body's vLLM lines repeated for 3 engines and 2 models, plus LoRA info,
    label values holding , } = and spaces, a trailing comma, a timestamp, a tab, and
    +Inf/NaN/exponent values (all of them valid exposition text)."""
    out = []
    for line in base.splitlines():
        if not line.startswith("vllm:") or "{" not in line:
            out.append(line)
            continue
        for engine in ("0", "1", "2"):
            for model in ("tiny", "lora-base"):
                repl = line.replace('engine="0"', f'engine="{engine}"').replace(
                    'model_name="', f'model_name="{model}-'
                )
                out.append(repl)
    out += [
        "# HELP vllm:lora_requests_info Running stats on lora requests.",
        "# TYPE vllm:lora_requests_info gauge",
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",'
        'waiting_lora_adapters=""} 1.7e9',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity, kv",} 3',
        'vllm:num_requests_waiting_by_reason{engine="1",reason="a}b=c"} 2 1700000000000',
        'vllm:request_success_total{engine="0",finished_reason="odd name"}\t5',
        'vllm:time_to_first_token_seconds_bucket{engine="7",le="+Inf",model_name="m"} +Inf',
        'vllm:time_to_first_token_seconds_bucket{engine="7",le="0.5",model_name="m"} 1e1',
        'vllm:kv_cache_usage_perc{engine="9",model_name="m"} NaN',
        "vllm:num_preemptions_total 12",
    ]
    return "\n".join(out) + "\n"


def test_many_labels_lora_histograms_same_numbers() -> None:
    text = _many_labels((DATA / "vllm_metrics_tiny_llama.txt").read_text())
    ref = parse_samples(text)
    assert ref.engines == 3  # engines counted from num_requests_running: 0, 1, 2
    # each engine's own series, summed over its two models; engine 9 has only a KV gauge
    assert set(ref.per_engine) == {"0", "1", "2", "9"}
    one = parse_samples((DATA / "vllm_metrics_tiny_llama.txt").read_text()).per_engine["0"]
    for engine in ("0", "1", "2"):
        assert ref.per_engine[engine] == {k: 2 * v for k, v in one.items()}, engine
    assert math.isnan(ref.per_engine["9"]["vllm:kv_cache_usage_perc"])
    # a line without an engine label is engine "0"'s (a single-engine server's)
    assert ref.per_engine["0"].keys() == one.keys()
    assert ref.labelled["vllm:num_requests_waiting_by_reason"]["a}b=c"] == 2
    assert ref.labelled["vllm:num_requests_waiting_by_reason"]["capacity, kv"] == 3
    same(fast_only(text), ref)


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{model_name="a\\"b"} 1',  # an escape
        'vllm:num_requests_running{model_name="a",model_name="b"} 1',  # duplicate label
        'vllm:num_requests_running{__name__="x"} 1',
        "vllm:num_requests_running 1 2 3",
        "vllm:num_requests_running 1_0",
        'vllm:num_requests_running{model_name="a" } 1',
        'vllm:num_requests_running{"model_name"="a"} 1',
    ],
)
def test_unusual_lines_fall_back_to_the_reference(line: str) -> None:
    with pytest.raises(Unsupported):
        tokenize(line)
    text = f"vllm:num_requests_waiting 2\n{line}\n"
    try:
        ref = parse_samples(text)
    except ValueError:
        with pytest.raises(ValueError):
            parse_samples_fast(text)
        return
    same(parse_samples_fast(text), ref)


def test_escaped_body_equal_through_fallback(monkeypatch) -> None:
    calls = []
    real = metrics_fast.parse_samples
    monkeypatch.setattr(metrics_fast, "parse_samples", lambda t: calls.append(1) or real(t))
    text = 'vllm:num_requests_running{engine="0",model_name="x\\\\y"} 3\n'
    assert parse_samples_fast(text).labelled == parse_samples(text).labelled
    assert parse_samples_fast(text).values == {"vllm:num_requests_running": 3.0}
    assert calls  # the reference parsed it


def test_unparsable_body_raises_like_the_reference() -> None:
    text = "vllm:num_requests_running{oops 1\n"
    with pytest.raises(ValueError):
        parse_samples(text)
    with pytest.raises(ValueError):
        parse_samples_fast(text)


def test_cache_reuses_unchanged_lines_and_reparses_changed_ones() -> None:
    base = (DATA / "vllm_metrics_tiny_llama.txt").read_text()
    cache = MetricsCache()
    first = cache.parse(base)
    same(first, parse_samples(base))
    assert cache.parse(base) is first  # nothing changed: the same snapshot
    changed = render_metrics(base, {"vllm:generation_tokens_total": 999.5})
    second = cache.parse(changed)
    assert second.values["vllm:generation_tokens_total"] == 999.5
    same(second, parse_samples(changed))


def _delta_reference(prev, cur):
    """Each bound's count less the earlier count at that bound (0 where new); None if any fell."""
    before = dict(prev)
    deltas = tuple((le, count - before.get(le, 0.0)) for le, count in cur)
    return None if any(d < 0 for _, d in deltas) else deltas


def test_bucket_delta_fast_path_equals_the_general_one() -> None:
    from opsctl.domain.metrics import bucket_delta

    inf = float("inf")
    a = ((0.1, 1.0), (1.0, 5.0), (inf, 6.0))
    cases = [
        (a, ((0.1, 2.0), (1.0, 9.0), (inf, 11.0))),  # same bounds: the fast path
        (a, a),
        (a, ((0.1, 0.0), (1.0, 9.0), (inf, 11.0))),  # a count went back: a reset
        (a, ((0.2, 2.0), (1.0, 9.0), (inf, 11.0))),  # other bounds, same length
        (a, ((0.1, 2.0), (0.5, 3.0), (1.0, 9.0), (inf, 11.0))),  # a bound added
        (((0.5, 1.0), (inf, 2.0)), ((0.1, 1.0), (inf, 3.0))),
    ]
    for prev, cur in cases:
        assert bucket_delta(prev, cur) == _delta_reference(prev, cur)
