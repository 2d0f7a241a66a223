"""The KV load-failure routes a release handles (opsctl.domain.kv_routes), read from
sources: vLLM 0.32's as installed here, and the shapes of 0.26's and of a fixed release
written out (0.26's wheel is not in CI; tests/e2e/test_preflight_wheels.py reads 0.33's
and 0.34's)."""

from __future__ import annotations

from opsctl.collectors.vllm_sources import InstalledSources
from opsctl.domain import kv_routes as K


def _installed() -> dict[str, str | None]:
    reader = InstalledSources()
    return {m: reader.read(m) for m in K.MODULES}


def test_vllm_032_as_installed():
    requests, multi, single = K.routes(_installed())
    assert (requests.route, requests.status) == ("failed requests (async loads)", K.SAFE)
    assert (
        "from token 0" in requests.advice
        and "must not offer the failed KV again" in requests.advice
    )
    assert multi.status == K.PATCHED and "RuntimeError" in multi.advice
    assert "kv_hybrid_recompute" in multi.advice
    assert single.status == K.PATCHED and "policy fail is safe" in single.advice
    assert "kv_rewind_v2" in single.advice and "kv_async_inflight" in single.advice
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in single.advice  # 0.32 still has the V1 runner


SCHED_026 = """
class Scheduler:
    def _update_requests_with_invalid_blocks(self, requests, invalid, scheduled):
        for request in requests:
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)

    def _handle_invalid_blocks(self, invalid, scheduled):
        return self._update_requests_with_invalid_blocks(self.running, invalid, scheduled)
"""
RUNNER_UNFIXED = """
class GPUModelRunner:
    def update_requests(self, scheduler_output):
        num_computed_tokens_np[req_index] = num_computed_tokens
"""


def test_a_release_shaped_like_026():
    texts = {K.SCHEDULER: SCHED_026, K.CONNECTOR_BASE: "", K.V2_RUNNER: RUNNER_UNFIXED}
    requests, multi, single = K.routes(texts)
    assert requests.status == K.ABSENT
    assert multi.status == K.PATCHED and "ValueError" in multi.advice
    assert single.status == K.PATCHED and "no V1 runner" in single.advice  # none given


def test_a_release_with_both_fixes_is_safe():
    sched = SCHED_026.replace(
        "(req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)",
        "request.num_output_placeholders = 0",
    )
    runner = RUNNER_UNFIXED.replace(
        "num_computed_tokens_np", "self.req_states.num_computed_tokens.stage_write_elem"
    )
    _requests, multi, single = K.routes({K.SCHEDULER: sched, K.V2_RUNNER: runner})
    assert (multi.status, single.status) == (K.SAFE, K.SAFE)


def test_without_the_scheduler_nothing_is_claimed():
    assert [r.status for r in K.routes({})] == [K.UNKNOWN]
