"""diag invariance on a data-parallel server: every request pinned to one engine (vLLM's
X-data-parallel-rank header), found from the /metrics engine labels; one engine: no pin.
On real DP=2 and TP=2 servers: the DP=2 tests of tests/e2e/test_dp_stall_e2e.py."""

from __future__ import annotations

from opsctl.collectors import http
from opsctl.suite.invariance import judge_engine as eng

DP2 = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 3.0
vllm:generation_tokens_total{engine="1",model_name="tiny-llama"} 12.0
"""
ONE = 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0\n'


def test_several_engine_labels_pin_the_first():
    assert eng.dp_engines(DP2) == [0, 1]
    assert eng.dp_pin(DP2) == 0
    assert eng.dp_pin(ONE) is None and eng.dp_pin("") is None


def test_a_pinned_block_sends_the_header_on_every_client_made_in_it():
    with http.client("k") as c:
        assert http.DP_RANK_HEADER not in c.headers
    with http.pinned_to_engine(1):
        with http.client("k") as c:
            assert c.headers[http.DP_RANK_HEADER] == "1"
            assert c.headers["Authorization"] == "Bearer k"
        with http.pinned_to_engine(None), http.client() as c:
            assert http.DP_RANK_HEADER not in c.headers
    with http.client() as c:
        assert http.DP_RANK_HEADER not in c.headers
