"""The console's pure decisions: states and every transition between them, rates from
counter deltas with resets, percentiles from bucket deltas, bounded history."""

from __future__ import annotations

import pytest

from opsctl.console import judge as c
from opsctl.console.judge_state import (
    NO_ENDPOINT,
    EndpointTracker,
    Settings,
    decide,
    exit_code,
    settle_undecided,
    undecided,
    verdict,
)
from opsctl.domain.metrics import (
    LATENCY_HISTOGRAMS,
    bucket_delta,
    histogram_quantile,
    parse_samples,
)
from tests.standins.vllm_server import METRICS, render_metrics

URL = "http://127.0.0.1:9"
TARGET = c.Target("t", URL, "argument")
OK = c.HttpStatus("/health", 200)


def body(running: float = 0, gen: float = 737, steps: float = 737, **more: float) -> str:
    values = {
        "vllm:num_requests_running": running,
        "vllm:generation_tokens_total": gen,
        "vllm:iteration_tokens_total_count": steps,
        **more,
    }
    return render_metrics(METRICS, values)


def scrape(t: float, text: str | None = None, health: int | None = 200, **kw) -> c.Scrape:
    samples = parse_samples(text) if text is not None else None
    h = c.HttpStatus("/health", health, None if health else "ConnectError: refused")
    m = c.HttpStatus("/metrics", 200 if samples else None)
    return c.Scrape(URL, t - 0.01, t, h, m, samples, **kw)


def tracker(**settings) -> EndpointTracker:
    return EndpointTracker(TARGET, Settings(**{"interval_s": 1.0, **settings}))


# ---- parsing the recorded real body ----------------------------------------------------------


def test_recorded_vllm_body_gives_every_figure_vllmstat_shows():
    s = parse_samples(METRICS)
    assert s.engines == 1 and s.vllm_series > 100
    assert s.get("vllm:generation_tokens_total") == 737.0
    assert set(s.labelled["vllm:prompt_tokens_by_source_total"]) == {
        "local_compute",
        "local_cache_hit",
        "external_kv_transfer",
    }
    assert set(LATENCY_HISTOGRAMS.values()) <= set(s.buckets)
    assert c.kv_tokens(s) == (8192 * 128, 0)
    f = c.figures(s, None, None, None)
    assert f.latency_basis == "lifetime"
    assert f.latency["ttft"].count == 24 and f.latency["ttft"].p50 is not None
    assert f.tokens_per_step == pytest.approx(3462 / 737)
    assert f.prompt_tokens_by_source["local_compute"] == 1.0
    assert f.finished_by_reason["length"] == 22.0


def test_histogram_quantile_and_bucket_delta():
    b = ((0.1, 10.0), (1.0, 20.0), (float("inf"), 20.0))
    assert histogram_quantile(b, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(b, 0.75) == pytest.approx(0.55)
    assert histogram_quantile(((0.1, 0.0), (float("inf"), 0.0)), 0.5) is None
    later = ((0.1, 10.0), (1.0, 30.0), (float("inf"), 31.0))
    assert bucket_delta(b, later) == ((0.1, 0.0), (1.0, 10.0), (float("inf"), 11.0))
    assert bucket_delta(later, b) is None  # went back: a reset


@pytest.mark.parametrize(
    ("prev", "cur", "want"), [(10, 15, 5), (10, 10, 0), (10, 3, 3), (None, 3, None)]
)
def test_counter_delta_never_negative(prev, cur, want):
    assert c.counter_delta(prev, cur) == want


# ---- states ----------------------------------------------------------------------------------


def test_idle_is_ready_and_running_with_progress_is_busy():
    t = tracker()
    assert t.observe(scrape(0, body())).state == c.READY
    v = t.observe(scrape(1, body(running=4, gen=937, steps=741)))
    assert v.state == c.BUSY and v.figures.generation_tps == pytest.approx(200 / 1.0, rel=0.02)
    assert v.figures.steps_per_s == pytest.approx(4, rel=0.02)


def test_stall_needs_the_full_window_then_recovers():
    t = tracker(stall_window_s=10.0)
    t.observe(scrape(0, body(running=16, gen=1000)))
    for sec in range(1, 10):  # flat, but not yet for 10 s
        assert t.observe(scrape(sec, body(running=16, gen=1000))).state == c.BUSY
    v = t.observe(scrape(10.5, body(running=16, gen=1000)))
    assert v.state == c.STALLED and v.health_status == 200
    assert "16 requests running" in v.reason and "engine steps and KV cache flat too" in v.reason
    assert "/health 200" in v.reason
    v = t.observe(scrape(11.5, body(running=16, gen=1400, steps=800)))  # SIGCONT
    assert v.state == c.BUSY and v.reason is None


def test_generation_flat_while_steps_advance_is_slow_not_stalled():
    """A long prefill (or a slowed engine): engine steps advance while no token is
    generated for longer than the window: busy, never stalled (issue 35 item 3)."""
    t = tracker(stall_window_s=2.0)
    t.observe(scrape(0, body(running=2, gen=5, steps=10)))
    for sec in range(1, 8):
        v = t.observe(scrape(sec, body(running=2, gen=5, steps=10 + 10 * sec)))
        assert v.state == c.BUSY, (sec, v.reason)
    for sec in range(8, 11):  # then the steps stop too: a stall, after the full window
        v = t.observe(scrape(sec, body(running=2, gen=5, steps=80)))
    assert v.state == c.STALLED and "engine steps and KV cache flat too" in v.reason


def test_a_long_prefill_fills_the_kv_cache_and_is_busy_not_stalled():
    """vLLM 0.32 counts no engine step and no token while a prompt is prefilled chunk by
    chunk (measured: tests/e2e/test_prefill_e2e.py); the KV cache's usage grows with
    each chunk: busy for as long as it grows, stalled a full window after it stops."""
    t = tracker(stall_window_s=2.0)
    for sec in range(0, 8):
        kv = body(running=1, gen=5, steps=10, **{"vllm:kv_cache_usage_perc": 0.01 * sec})
        v = t.observe(scrape(sec, kv))
        assert v.state == c.BUSY, (sec, v.reason)
    flat = body(running=1, gen=5, steps=10, **{"vllm:kv_cache_usage_perc": 0.07})
    for sec in range(8, 11):
        v = t.observe(scrape(sec, flat))
    assert v.state == c.STALLED and "KV cache flat too" in v.reason


def test_no_requests_is_never_stalled():
    t = tracker(stall_window_s=1.0)
    for sec in range(5):
        assert t.observe(scrape(sec, body(running=0))).state == c.READY


def test_reset_is_restarted_counted_and_never_a_negative_rate():
    t = tracker(restart_hold_s=3.0)
    t.observe(scrape(0, body(gen=5000, steps=900)))
    v = t.observe(scrape(1, body(gen=10, steps=3)))
    assert v.state == c.RESTARTED and v.restarts == 1
    assert v.figures.generation_tps is None or v.figures.generation_tps >= 0
    v = t.observe(scrape(2, body(gen=30, steps=5)))
    assert v.state == c.RESTARTED and v.figures.generation_tps == pytest.approx(20, rel=0.02)
    assert t.observe(scrape(4.5, body(gen=30, steps=5))).state == c.READY
    assert t.view.restarts == 1


def test_unauthorized_from_v1_is_remembered_between_info_fetches():
    t = tracker()
    info = c.EngineInfo(version="0.32.0", fetched_at=0.0)
    denied = c.HttpStatus("/v1/models", 401)
    v = t.observe(scrape(0, body(), info=info, auth=denied))
    assert v.state == c.UNAUTHORIZED and "/v1/models" in v.reason and "--api-key" in v.reason
    assert t.observe(scrape(1, body())).state == c.UNAUTHORIZED  # no info fetch this poll
    ok_info = c.EngineInfo(version="0.32.0", fetched_at=2.0)
    assert t.observe(scrape(2, body(), info=ok_info)).state == c.READY  # key accepted now


def test_dead_from_503_and_from_a_gone_process_with_log_lines():
    t = tracker()
    assert t.observe(scrape(0, body(), health=503)).state == c.DEAD
    gone = c.LocalState(False, "process 42 exited", death_lines=("EngineCore: RuntimeError: boom",))
    t.set_local(gone)
    assert t.view.state == c.DEAD and "boom" in t.view.reason and "42" in t.view.reason


def test_starting_unreachable_and_not_vllm():
    t = tracker()
    t.set_local(c.LocalState(True, load_phase="loading model"))
    v = t.observe(scrape(0, None, health=None))
    assert (v.state, v.reason) == (c.STARTING, "loading model")
    remote = tracker()
    v = remote.observe(scrape(0, None, health=None))
    assert v.state == c.UNREACHABLE and "refused" in v.reason
    v = remote.observe(scrape(1, "# just an app\nhttp_requests_total 3\n", health=404))
    assert v.state == c.UNREACHABLE and "not a vLLM server" in v.reason


def test_decide_before_any_poll():
    assert decide(None, None, None, False)[0] == c.UNREACHABLE
    assert decide(None, c.LocalState(True), None, False)[0] == c.STARTING


def test_recovery_from_unreachable_keeps_rates_and_marks_age():
    t = tracker()
    t.observe(scrape(0, body(gen=100)))
    v = t.observe(scrape(1, None, health=None))
    assert v.state == c.UNREACHABLE and v.age(5.0) == pytest.approx(5.0)
    v = t.observe(scrape(2, body(gen=300)))
    assert v.state == c.READY and v.figures.generation_tps == pytest.approx(100, rel=0.02)


# ---- latency window, history ------------------------------------------------------------------


def _ttft_body(n_fast: float, n_slow: float, gen: float) -> str:
    """A body whose TTFT histogram holds n_fast observations <= 1 ms and n_slow <= 5 s."""
    name = LATENCY_HISTOGRAMS["ttft"]
    lines = []
    for line in body(gen=gen).splitlines():
        if line.startswith(f"{name}_bucket"):
            le = float(line.split('le="', 1)[1].split('"', 1)[0])
            v = (n_fast if le >= 0.001 else 0) + (n_slow if le >= 5.0 else 0)
            line = line.rsplit(" ", 1)[0] + f" {v}"
        elif line.startswith((f"{name}_count", f"{name}_sum")):
            v = n_fast + n_slow if "_count" in line else n_fast * 0.001 + n_slow * 5
            line = line.rsplit(" ", 1)[0] + f" {v}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_percentiles_come_from_the_window_not_the_lifetime():
    t = tracker(latency_window_s=60.0)
    t.observe(scrape(0, _ttft_body(1000, 0, 10)))  # a fast past
    v = t.observe(scrape(1, _ttft_body(1000, 10, 20)))  # 10 slow requests now
    q = v.figures.latency["ttft"]
    assert v.figures.latency_basis == "window" and q.count == 10 and q.p50 > 1.0
    assert q.mean == pytest.approx(5.0)
    v = t.observe(scrape(2, _ttft_body(1000, 10, 20)))  # no new request
    assert v.figures.latency["ttft"].count == 10  # still the window since t=0


def test_cached_percentiles_are_the_computed_ones():
    """latency_figures caches each histogram's figures on its inputs: poll after poll
    (the window sliding, histograms moving or not) they equal a fresh computation."""
    t = tracker(latency_window_s=3.0)
    bodies = [_ttft_body(1000, 0, 10)] * 2 + [_ttft_body(1000, n, 20 + n) for n in (0, 5, 5, 9)]
    bodies += [_ttft_body(1000, 9, 30)] * 5 + [_ttft_body(2000, 9, 40)]
    for i, text in enumerate(bodies):
        v = t.observe(scrape(i, text))
        c._histogram_figures.cache_clear()
        fresh = c.latency_figures(t.window[-1][1], t.window[0][1])
        assert (v.figures.latency, v.figures.latency_basis) == fresh, i


def test_history_is_bounded():
    t = tracker(history_s=5.0, latency_window_s=3.0)
    for sec in range(50):
        t.observe(scrape(sec, body(gen=sec * 10)))
    assert len(t.series("generation_tps")) == 5
    assert len(t.window) <= 5


def test_exit_codes():
    def view(state: str) -> c.EndpointView:
        return c.EndpointView(TARGET, state, None, c.Figures(), c.EngineInfo(), None, None,
                              None, None, 0, 0, None)  # fmt: skip

    assert exit_code([]) == 3  # a gate that checked nothing does not pass
    assert "no vLLM server found" in verdict([])[1] and "--targets" in verdict([])[1]
    assert verdict([], "prometheus") == (3, NO_ENDPOINT["prometheus"])
    assert exit_code([view(c.READY), view(c.BUSY), view(c.RESTARTED)]) == 0
    for bad in (c.STALLED, c.DEAD, c.UNAUTHORIZED, c.UNREACHABLE):
        assert exit_code([view(c.READY), view(bad)]) == 1
    assert exit_code([view(c.UNREACHABLE), view(c.UNREACHABLE)]) == 3
    code, reason = verdict([view(c.READY), view(c.STALLED), view(c.DEAD)])
    assert code == 1 and reason.startswith("1 dead, 1 stalled of 3 endpoints")


def test_once_waits_on_running_requests_until_progress_or_the_window():
    """--once: an endpoint with requests running whose generation was not seen moving is
    undecided until the counter moves (busy) or the stall window passes (stalled); idle,
    progressing and failing endpoints are decided at once."""
    t = tracker(stall_window_s=3.0)
    assert undecided(t.observe(scrape(0, body(running=4, gen=100))))  # no rate yet
    v = t.observe(scrape(1, body(running=4, gen=100)))
    assert v.state == c.BUSY and undecided(v)  # flat for one interval: not yet a stall
    v = t.observe(scrape(2, body(running=4, gen=150)))
    assert v.state == c.BUSY and not undecided(v)  # progress seen: busy
    v = t.observe(scrape(3, body(running=4, gen=150)))
    assert undecided(v)  # flat again: keep looking
    v = t.observe(scrape(5, body(running=4, gen=150)))
    assert v.state == c.STALLED and not undecided(v)  # the window passed: stalled
    idle = tracker()
    assert not undecided(idle.observe(scrape(0, body(running=0))))
    assert not undecided(idle.observe(scrape(1, health=None)))
    prefill = tracker(stall_window_s=3.0)  # no token, but the steps move: decided busy
    prefill.observe(scrape(0, body(running=1, gen=100, steps=10)))
    v = prefill.observe(scrape(1, body(running=1, gen=100, steps=14)))
    assert v.state == c.BUSY and not undecided(v)


def test_an_endpoint_still_undecided_after_the_window_is_settled_as_stalled():
    t = tracker(stall_window_s=10.0)
    t.observe(scrape(0, body(running=16, gen=100)))
    v = t.observe(scrape(1, body(running=16, gen=100)))  # scrapes too sparse to decide
    ready = tracker().observe(scrape(1, body()))
    assert settle_undecided((v, ready), 5.0, 10.0) == (v, ready)  # window not over yet
    out = settle_undecided((v, ready), 10.5, 10.0)
    assert out[0].state == c.STALLED and "not seen moving in 10 s" in out[0].reason
    assert out[1] is ready
    assert exit_code(out) == 1


def test_a_stall_names_the_requests_waiting_by_reason():
    """vLLM's waiting-by-reason (#56640): requests the scheduler skips (LoRA budget, KV
    transfer, blocked) are named in a stall's reason, next to those waiting for capacity."""
    from opsctl.console.judge_state import waiting_text
    from opsctl.domain.metrics import WAITING, WAITING_BY_REASON, MetricSamples

    by = {"capacity": 1.0, "deferred": 2.0}
    s = MetricSamples({WAITING: 3.0, "vllm:num_requests_running": 2.0},
                      {WAITING_BY_REASON: by}, {}, {}, 1, 2)  # fmt: skip
    text = waiting_text(s)
    assert text.startswith(", 3 waiting (capacity 1, deferred 2) (deferred: skipped by")
    assert waiting_text(MetricSamples({WAITING: 0.0}, {}, {}, {}, 1, 1)) == ""
    plain = MetricSamples({WAITING: 4.0}, {}, {}, {}, 1, 1)  # a vLLM without the gauge
    assert waiting_text(plain) == ", 4 waiting"
    t = tracker(stall_window_s=2.0)
    more = {"vllm:num_requests_waiting": 3.0}
    for sec in (0, 1, 2.5):
        v = t.observe(scrape(sec, body(running=2, gen=5, steps=9, **more)))
    assert v.state == c.STALLED and "2 requests running, 3 waiting, generation" in v.reason
