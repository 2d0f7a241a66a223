"""The advisor's rules (opsctl.console.judge_advisor), each at its boundary: the figures that
trigger it and the ones just short of it; windows from scrapes (an old event ages out);
the order, the row marker and the JSON shape."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opsctl.console import judge as c
from opsctl.console import judge_advisor as a
from opsctl.console import render_advice as text
from opsctl.domain.gpu import GpuDevice
from opsctl.domain.metrics import (
    PREEMPTIONS,
    REQUEST_SUCCESS,
    WAITING,
    MetricSamples,
)

URL = "http://127.0.0.1:9"


def view(
    state: str = c.READY,
    figures: c.Figures | None = None,
    max_model_len: int | None = 1000,
    run_dir: str | None = None,
    gpus: tuple = (),
    reason: str | None = None,
    restarts: int = 0,
) -> c.EndpointView:
    return c.EndpointView(
        target=c.Target("t", URL, "argument", run_dir=run_dir),
        state=state,
        reason=reason,
        figures=figures or c.Figures(),
        info=c.EngineInfo(models=(c.ModelInfo("m", max_model_len),)),
        local=None,
        health_status=200,
        last_scrape_at=1.0,
        last_ok_at=1.0,
        scrapes=2,
        restarts=restarts,
        poll_s=0.01,
        gpus=gpus,
    )


def win(**kw) -> a.Window:
    kw.setdefault("window_s", 10.0)
    kw.setdefault("scrapes", 11)
    return a.Window(**kw)


def gpu(temp: float | None = 60.0, power: float | None = 200.0, limit: float | None = 700.0):
    return GpuDevice(
        index=0, name="H200", uuid=None, vendor="nvidia", util_pct=50.0,
        mem_used_bytes=1, mem_total_bytes=2, temp_c=temp, temp_slowdown_c=90.0,
        power_w=power, power_limit_w=limit, fan_pct=None, sm_clock_mhz=None,
        mem_clock_mhz=None,
    )  # fmt: skip


def codes(v: c.EndpointView, w: a.Window | None, local: a.LocalFacts | None = None) -> dict:
    return {f.code: f for f in a.window_findings(v, w, local)}


# ---- vllmstat's codes -----------------------------------------------------------------------


@pytest.mark.parametrize(("preemptions", "fires"), [(0.5, True), (0.49, False), (0.0, False)])
def test_kv_preemption_rate_over_the_window(preemptions, fires):
    # 0.05/s over a 10 s window: 0.5 preemptions
    v = view(figures=c.Figures(kv_usage=0.97))
    found = codes(v, win(preemptions=preemptions))
    assert ("kv_preemption" in found) is fires
    if fires:
        f = found["kv_preemption"]
        assert f.severity == "warning" and f.next == f"opsctl console {URL}"
        assert f.figures["window_s"] == 10.0 and f.figures["preemptions"] == 0.5
        assert f.figures["preemptions_per_s"] == 0.05 and f.figures["kv_cache_usage"] == 0.97


@pytest.mark.parametrize(("rate", "fires"), [(0.05, True), (0.049, False), (None, False)])
def test_kv_preemption_without_a_window_reads_the_interval_rate(rate, fires):
    found = codes(view(figures=c.Figures(preemption_rate=rate)), None)
    assert ("kv_preemption" in found) is fires
    if fires:
        assert found["kv_preemption"].figures["window_s"] is None


@pytest.mark.parametrize(
    ("length", "stop", "severity"),
    [(50, 50, "warning"), (49, 51, "info"), (20, 80, "info"), (19, 81, None), (0, 0, None)],
)
def test_output_truncation_fraction_of_finished_in_the_window(length, stop, severity):
    found = codes(view(), win(finished={"length": length, "stop": stop, "error": 0.0}))
    got = found.get("output_truncation")
    assert (got.severity if got else None) == severity
    if got:
        assert got.figures["length_fraction"] == length / 100
        assert got.figures["finished"] == 100 and got.figures["window_s"] == 10.0


@pytest.mark.parametrize(("errors", "fires"), [(2, True), (1.99, False), (0, False)])
def test_request_errors_fraction(errors, fires):
    found = codes(view(run_dir="/runs/r1"), win(finished={"stop": 100 - errors, "error": errors}))
    assert ("request_errors" in found) is fires
    if fires:
        f = found["request_errors"]
        assert f.figures["error_fraction"] == 0.02 and f.next == "opsctl runs bundle r1"


@pytest.mark.parametrize(
    ("prompt", "output", "mml", "fires"),
    [(200, 299, 1000, True), (200, 300, 1000, False), (200, 299, None, False)],
)
def test_context_overprovisioned_largest_request_in_the_window(prompt, output, mml, fires):
    v = view(max_model_len=mml)
    found = codes(
        v, win(max_prompt_tokens=prompt, max_output_tokens=output, finished={"stop": 10.0})
    )
    assert ("context_overprovisioned" in found) is fires
    if fires:
        assert found["context_overprovisioned"].figures["largest_request_tokens"] == 499


def test_context_overprovisioned_needs_requests_in_the_window():
    assert "context_overprovisioned" not in codes(view(), win())


@pytest.mark.parametrize(("n", "fires"), [(1, False), (9, False), (10, True)])
def test_shares_need_ten_finished_requests(n, fires):
    """One request in a window -- the console's canary: 1 token, finished at its cap, a
    one-word prompt -- is no evidence: neither truncation nor an over-sized context."""
    w = win(finished={"length": float(n)}, max_prompt_tokens=1, max_output_tokens=1)
    found = codes(view(max_model_len=1000), w)
    assert ("output_truncation" in found) is fires
    assert ("context_overprovisioned" in found) is fires


@pytest.mark.parametrize(
    ("util", "gpus", "fires"),
    [("0.84", (gpu(),), True), ("0.85", (gpu(),), False), ("0.5", (), False)],
)
def test_gpu_mem_under_only_on_a_gpu(util, gpus, fires):
    found = codes(view(gpus=gpus), win(config={"gpu_memory_utilization": util}))
    assert ("gpu_mem_under" in found) is fires
    if fires:
        assert found["gpu_mem_under"].figures["gpu_memory_utilization"] == 0.84


@pytest.mark.parametrize(("peak", "fires"), [(2.0, True), (1.0, False), (None, False)])
def test_queue_backlog_peak_waiting_in_the_window(peak, fires):
    found = codes(view(figures=c.Figures(waiting=0.0)), win(peak_waiting=peak))
    assert ("queue_backlog" in found) is fires
    if fires:
        f = found["queue_backlog"]
        assert f.figures["peak_waiting"] == 2.0 and f.figures["waiting_now"] == 0.0


def test_queue_backlog_without_a_window_reads_waiting_now():
    assert "queue_backlog" in codes(view(figures=c.Figures(waiting=2.0)), None)
    assert "queue_backlog" not in codes(view(figures=c.Figures(waiting=1.0)), None)


@pytest.mark.parametrize(
    ("drafted", "accepted", "fires"), [(100, 29, True), (100, 30, False), (0, 0, False)]
)
def test_spec_ineffective_acceptance(drafted, accepted, fires):
    found = codes(view(), win(spec_draft_tokens=drafted, spec_accepted_tokens=accepted))
    assert ("spec_ineffective" in found) is fires


@pytest.mark.parametrize(
    ("temp", "power", "fires"),
    [(85.0, 200.0, True), (84.9, 200.0, False), (60.0, 686.0, True), (60.0, 685.9, False),
     (None, None, False)],
)  # fmt: skip
def test_gpu_thermal_temperature_or_power_near_limit(temp, power, fires):
    found = codes(view(gpus=(gpu(temp, power, 700.0),)), win())
    assert ("gpu_thermal" in found) is fires
    if fires:
        assert found["gpu_thermal"].figures["gpu"] == 0


@pytest.mark.parametrize(("label", "fires"), [("False", True), ("True", False), (None, False)])
def test_prefix_caching_off_from_cache_config_info(label, fires):
    config = {} if label is None else {"enable_prefix_caching": label}
    found = codes(view(), win(config=config))
    assert ("prefix_caching_off" in found) is fires
    if fires:
        assert found["prefix_caching_off"].figures["window_s"] is None


# ---- opsctl's own ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "code", "severity"),
    [(c.STALLED, "stalled", "fail"), (c.UNAUTHORIZED, "unauthorized", "fail"),
     (c.RESTARTED, "restarted", "warning"), (c.BUSY, None, None), (c.READY, None, None)],
)  # fmt: skip
def test_state_findings(state, code, severity):
    found = a.findings(view(state=state, reason="why", run_dir="/runs/r1"))
    assert [(f.code, f.severity) for f in found] == ([(code, severity)] if code else [])
    if code == "stalled":
        assert found[0].next == "opsctl runs bundle r1" and found[0].message == "stalled: why"
    if code == "unauthorized":
        assert found[0].next == f"opsctl console {URL} --api-key KEY"


@pytest.mark.parametrize(("failed", "fires"), [(("batch_probe (engine pid 7): boom",), True),
                                               ((), False)])  # fmt: skip
def test_patch_failed_from_the_ledger(failed, fires):
    found = codes(view(run_dir="/runs/r1"), None, a.LocalFacts(failed_patches=failed))
    assert ("patch_failed" in found) is fires
    if fires:
        f = found["patch_failed"]
        assert f.severity == "fail" and f.next == "opsctl patches --run r1"
        assert "batch_probe" in f.message


@pytest.mark.parametrize(("knobs", "fires"), [({"OPSCTL_TEST_NUDGE": "fox:3"}, True), ({}, False)])
def test_test_knob_active(knobs, fires):
    found = codes(view(run_dir="/runs/r1"), None, a.LocalFacts(knobs=knobs))
    assert ("test_knob_active" in found) is fires
    if fires:
        assert "OPSCTL_TEST_NUDGE=fox:3" in found["test_knob_active"].message


# ---- windows --------------------------------------------------------------------------------


def samples(preempt: float = 0, length: float = 0, stop: float = 0, waiting: float = 0,
            info: dict | None = None, prompt_buckets=None) -> MetricSamples:  # fmt: skip
    return MetricSamples(
        values={PREEMPTIONS: preempt, REQUEST_SUCCESS: length + stop, WAITING: waiting},
        labelled={REQUEST_SUCCESS: {"length": length, "stop": stop}},
        buckets={"vllm:request_prompt_tokens": prompt_buckets} if prompt_buckets else {},
        info=info or {},
        engines=1,
        vllm_series=10,
    )


def test_window_counts_increases_between_its_first_and_last_scrape():
    pts = [
        (100.0, samples(preempt=5, length=10, stop=2, waiting=0)),
        (105.0, samples(preempt=6, length=12, stop=2, waiting=3)),
        (110.0, samples(preempt=8, length=14, stop=4, waiting=1,
                        info={"enable_prefix_caching": "False"})),
    ]  # fmt: skip
    w = a.window_of(pts)
    assert w is not None
    assert (w.window_s, w.scrapes, w.preemptions) == (10.0, 3, 3.0)
    assert w.finished == {"length": 4.0, "stop": 2.0} and w.peak_waiting == 3.0
    assert w.config == {"enable_prefix_caching": "False"}
    assert a.window_of([]) is None


def test_an_old_burst_ages_out_of_the_window():
    """Lifetime totals keep 50 preemptions and 40 length finishes; a window after them
    saw none, so neither finding fires -- and one that includes the burst fires both."""
    burst = [(0.0, samples()), (10.0, samples(preempt=50, length=40))]
    quiet = [(70.0, samples(preempt=50, length=40)), (80.0, samples(preempt=50, length=40))]
    assert {"kv_preemption", "output_truncation"} <= set(codes(view(), a.window_of(burst)))
    assert not {"kv_preemption", "output_truncation"} & set(codes(view(), a.window_of(quiet)))


def test_max_bound_is_the_highest_bucket_with_observations():
    inf = float("inf")
    assert a.max_bound(((10.0, 0.0), (100.0, 3.0), (200.0, 5.0), (inf, 5.0))) == 200.0
    assert a.max_bound(((10.0, 0.0), (inf, 2.0))) == inf
    assert a.max_bound(((10.0, 0.0), (inf, 0.0))) is None
    w = a.window_of([
        (0.0, samples(prompt_buckets=((50.0, 4.0), (100.0, 4.0), (inf, 4.0)))),
        (5.0, samples(prompt_buckets=((50.0, 4.0), (100.0, 6.0), (inf, 6.0)))),
    ])  # fmt: skip
    assert w is not None and w.max_prompt_tokens == 100.0  # the old 50s are outside it


# ---- order, marker, JSON --------------------------------------------------------------------


def test_findings_most_severe_first_and_marker():
    v = view(state=c.RESTARTED, reason="counters went back")
    w = win(config={"enable_prefix_caching": "False"}, preemptions=5.0)
    v = replace(v, findings=tuple(codes(v, w, a.LocalFacts(failed_patches=("p",))).values()))
    found = a.findings(v)
    assert [f.code for f in found] == ["patch_failed", "restarted", "kv_preemption",
                                       "prefix_caching_off"]  # fmt: skip
    assert text.marker(v) == "patch_failed +3"
    assert text.marker(view()) == ""
    d = found[0].to_dict()
    assert set(d) == {"code", "severity", "message", "figures", "next"}
    assert d["figures"]["window_s"] is None
