import pytest

from opsctl.collectors.metrics import parse_metrics
from opsctl.domain.metrics import key_metrics
from opsctl.domain.serverlog import LoadProgress
from opsctl.serve.judge_state import derive_state

TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} %(prompt)s
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} %(gen)s
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %(n)s
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %(n)s
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %(s)s
# TYPE python_gc_objects_collected counter
python_gc_objects_collected_total{generation="0"} 5.0
"""


def snap(t, prompt, gen, n, s):
    return parse_metrics(TEXT % {"prompt": prompt, "gen": gen, "n": n, "s": s}, taken_at=t)


def test_parse_keeps_only_vllm_series_and_sums_labels():
    m = snap(0, 10, 20, 2, 0.5)
    assert m.get("vllm:num_requests_running") == 2.0
    assert m.get("vllm:prompt_tokens_total") == 10
    assert "python_gc_objects_collected_total" not in m.values


def test_key_metrics_rates_and_interval_ttft():
    prev = snap(100.0, 10, 20, 2, 0.5)
    cur = snap(102.0, 30, 120, 4, 1.5)
    km = key_metrics(cur, prev)
    assert km.prompt_tps == pytest.approx(10.0)
    assert km.generation_tps == pytest.approx(50.0)
    assert km.ttft_mean_s == pytest.approx(0.5)  # (1.5-0.5)/(4-2)
    assert km.kv_cache_usage == 0.25 and km.running == 2 and km.waiting == 1


def test_key_metrics_without_previous_has_no_rates():
    km = key_metrics(snap(1.0, 10, 20, 4, 2.0))
    assert km.prompt_tps is None and km.generation_tps is None
    assert km.ttft_mean_s == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("exit_code", "healthy", "step", "stopping", "state"),
    [
        (None, False, 0, False, "starting"),
        (None, False, 3, False, "loading"),
        (None, True, 8, False, "ready"),
        (1, False, 3, False, "dead"),
        (0, False, 8, True, "stopped"),
    ],
)
def test_derive_state(exit_code, healthy, step, stopping, state):
    assert (
        derive_state(exit_code, healthy, LoadProgress("x", step, 8, None, None), stopping) == state
    )
