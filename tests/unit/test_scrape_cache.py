"""The console's per-endpoint /metrics cache (opsctl.collectors.scrape.MetricsCache) gives
prometheus_client's numbers (the reference) poll after poll, whatever the sequence of
bodies: recorded real vLLM bodies, the benchmark's changing counters, many engines and
label sets, a change in lines the console does not read, line breaks other than "\\n"
(metrics_fast.scan's path), a line the tokenizer does not take (the reference parser's
path) and back; and it does no work for a body equal to the previous one."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.collectors import scrape
from opsctl.collectors.scrape import MetricsCache
from opsctl.domain import metrics_fast
from opsctl.domain.metrics import parse_samples
from tests.standins.vllm_server import render_metrics
from tests.unit.test_metrics_fast import _many_labels, same

DATA = Path(__file__).resolve().parents[1] / "data"
BASE = (DATA / "vllm_metrics_tiny_llama.txt").read_text()


def _busy(i: int, base: str = BASE) -> str:
    return render_metrics(
        base,
        {
            "vllm:num_requests_running": 4.0 + i,
            "vllm:generation_tokens_total": 737.0 + 200.25 * i,
            "vllm:iteration_tokens_total_count": 737.0 + 4 * i,
            "vllm:time_to_first_token_seconds_count": 10.0 + i,
        },
    )


def _without(text: str, family: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith(family))


def _line(text: str, name: str) -> str:
    return next(line for line in text.splitlines(True) if line.startswith(name + "{"))


def _sequence() -> list[tuple[str, str]]:
    many = _many_labels(BASE)
    out = [(f"recorded {p.name}", p.read_text()) for p in sorted(DATA.glob("vllm_metrics_*.txt"))]
    out += [(f"busy {i}", _busy(i)) for i in range(4)]
    out += [
        ("comment changed", _busy(3).replace("# HELP vllm:num_requests_running", "# HELP x", 1)),
        ("process metric changed", _busy(3) + "process_cpu_seconds_total 12.5\n"),
        ("crlf", _busy(4).replace("\n", "\r\n")),
        ("busy again", _busy(5)),
        ("an escape: the reference", _busy(6) + 'vllm:num_requests_running{x="a\\"b"} 1\n'),
        ("busy after the escape", _busy(7)),
        ("many engines", many),
        ("many engines changed", render_metrics(many, {"vllm:num_requests_running": 2.0})),
        ("a line separator in a comment", _busy(8).replace("# HELP", "# HELP \u2028", 1)),
        ("a new series", _busy(9) + 'vllm:num_preemptions_total{engine="5"} 3\n'),
        ("a series gone", _busy(9)),
        ("a histogram gone", _without(_busy(10), "vllm:e2e_request_latency_seconds")),
        ("it is back", _busy(10)),
        ("cache config changed", _busy(11).replace(',block_size="128"', ',block_size="256"')),
        ("a repeated line", _busy(11) + _line(_busy(11), "vllm:num_requests_running")),
        ("repeated twice", _busy(11) + _line(_busy(11), "vllm:num_requests_running") * 2),
        ("repeated, another", _busy(11) + _line(_busy(11), "vllm:generation_tokens_total")),
        ("no repeat", _busy(11)),
        ("empty", ""),
        ("back", _busy(10)),
    ]
    return out


def test_every_poll_gives_the_reference_numbers():
    cache = MetricsCache()
    for name, text in _sequence():
        got = cache.parse(text)
        try:
            same(got, parse_samples(text))
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


def test_scan_in_one_pass_keeps_metrics_fast_scans_lines():
    cache = MetricsCache()
    for name, text in _sequence():
        if any(b in text for b in scrape._BREAKS) or "\\" in text:
            continue
        prepared, series, _, _ = cache._scan_cached(text)
        lines, want_series = metrics_fast.scan(text)
        assert series == want_series, name
        assert repr(prepared) == repr([metrics_fast.prepare(line) for line in lines]), name
        cache.parse(text)


def test_an_unchanged_body_is_not_scanned_again(monkeypatch):
    cache = MetricsCache()
    first = cache.parse(_busy(1))
    calls = []
    monkeypatch.setattr(cache, "_scan_cached", lambda t: calls.append(t))
    assert cache.parse(_busy(1)) is first and not calls  # equal text: the same snapshot


def test_only_unread_lines_changed_keeps_the_snapshot():
    cache = MetricsCache()
    first = cache.parse(_busy(1))
    assert cache.parse(_busy(1) + "process_cpu_seconds_total 1.5\n") is first


def test_a_changed_body_prepares_only_its_changed_lines(monkeypatch):
    cache = MetricsCache()
    cache.parse(_busy(1))
    prepared = []
    real = metrics_fast.prepare
    monkeypatch.setattr(metrics_fast, "prepare", lambda line: prepared.append(line) or real(line))
    got = cache.parse(_busy(2))
    assert got.values["vllm:generation_tokens_total"] == 737.0 + 200.25 * 2
    assert sorted(p.split("{")[0].split(" ")[0] for p in prepared) == [
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_count",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds_count",
    ]


def test_not_prometheus_text_raises_and_keeps_the_previous_state():
    cache = MetricsCache()
    first = cache.parse(_busy(1))
    bad = "vllm:num_requests_running{oops 1\n"
    for _ in range(2):  # twice: a refused body is never taken for a known one
        with pytest.raises(ValueError):
            cache.parse(bad)
    assert cache.samples is first
    same(cache.parse(_busy(2)), parse_samples(_busy(2)))


def test_a_changed_body_sums_again_only_the_changed_names():
    """Only the changed names are summed again: the other figures are the previous
    snapshot's own objects (what lets the latency figures skip unchanged histograms)."""
    cache = MetricsCache()
    first = cache.parse(_busy(1))
    second = cache.parse(_busy(2))
    same(second, parse_samples(_busy(2)))
    ttft = "vllm:time_to_first_token_seconds"
    assert second.buckets[ttft] is first.buckets[ttft]  # its _count changed, not a bucket
    assert second.buckets["vllm:e2e_request_latency_seconds"] is not None
    for name, b in first.buckets.items():
        assert second.buckets[name] is b, name
    assert second.info is first.info
    assert (
        second.values["vllm:generation_tokens_total"]
        != first.values["vllm:generation_tokens_total"]
    )
