"""kv_async_inflight and kv_rewind_v2 (engine_patches/patches/kv_recovery.py).

The scheduler halves run on vLLM 0.32's real ``AsyncScheduler`` (one attention group,
a mocked scheduler-side connector that reports a synchronous external hit), driven the
way the EngineCore drives it under async scheduling: step N (the prompt's rest after
the loaded blocks) is scheduled, then step N+1 (the decode that takes step N's token)
before step N's output comes back; step N's output reports a failed block. Without the
patches vLLM 0.32 returns step N+1's token (sampled over the corrupted KV) to the
client and schedules the recompute with a stale placeholder; with them, the in-flight
frame is dropped and the next ``SchedulerOutput`` names the request as rewound.

The runner half (device-side count, total_len, bin counts) cannot run here: the V2
model runner needs Triton's GPU backend. :func:`rewind_runner_state` is exercised on a
stand-in ``req_states`` with CPU tensors in place of the device ones; the H200 recording
(tests/data/gpu/2026-12-04) is its proof on a real engine.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from unittest.mock import Mock

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from engine_patches.patches import kv_recovery as patch
from engine_patches.registry import APPLIED
from tests.standins.kv_scheduler import attention, example_transfer, scheduler, vllm_config

BLOCK = 16
PROMPT = 6 * BLOCK  # 96 tokens
EXTERNAL = 4 * BLOCK  # 64 loaded by the connector, synchronously
FAILED = 1  # the second loaded block fails: the scheduler rewinds to 16 tokens
GOOD, BAD = 7, 9  # the token sampled by step N, the one step N+1 samples over bad KV


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    patch.revert()
    yield tmp_path
    patch.revert()


def make_scheduler(model_dir: str, policy: str = "recompute") -> AsyncScheduler:
    config = vllm_config(
        model_dir,
        example_transfer(policy),
        block=BLOCK,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        async_scheduling=True,
    )
    groups = [KVCacheGroupSpec(["attn"], attention(BLOCK))]
    return scheduler(config, groups, 200, AsyncScheduler)


def admit(s: AsyncScheduler) -> Request:
    connector = Mock()
    connector.get_num_new_matched_tokens.side_effect = lambda req, _n: (EXTERNAL, False)
    connector.get_external_cache_hit_sources.side_effect = lambda req, n: {}
    connector.request_finished.return_value = (False, None)
    connector.take_events.return_value = ()
    s.connector = connector
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    request = Request(
        request_id="r",
        prompt_token_ids=[(i * 11) % 250 + 5 for i in range(PROMPT)],
        sampling_params=params,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )
    s.add_request(request)
    return request


def runner_output(token: int, invalid: set[int] = frozenset()) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        req_ids=["r"],
        req_id_to_index={"r": 0},
        sampled_token_ids=[[token]],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=KVConnectorOutput(invalid_block_ids=set(invalid)),
    )


def delivered(outputs) -> list[int]:
    return [t for outs in outputs.values() for o in outs.outputs for t in o.new_token_ids]


def fail_during_async_step(s: AsyncScheduler, r: Request):
    """Step N (prompt rest) and N+1 (decode) scheduled; N's output reports the failed
    block, then N+1's output (a token sampled over the bad block) arrives. Returns what
    each output delivered and the recompute step's SchedulerOutput."""
    step_n = s.schedule()
    assert step_n.num_scheduled_tokens == {"r": PROMPT - EXTERNAL}
    step_n1 = s.schedule()  # async: the decode is in flight before N's output
    assert step_n1.num_scheduled_tokens == {"r": 1}
    assert r.num_output_placeholders == 2
    bad_block = s.kv_cache_manager.get_block_ids("r")[0][FAILED]
    first = s.update_from_output(step_n, runner_output(GOOD, {bad_block}))
    second = s.update_from_output(step_n1, runner_output(BAD))
    return delivered(first), delivered(second), s.schedule()


def test_unpatched_vllm_returns_the_token_sampled_over_the_failed_block(model_dir, run_dir):
    s = make_scheduler(model_dir)
    r = admit(s)
    first, second, again = fail_during_async_step(s, r)
    assert first == []  # the failed step's own token is dropped by vLLM
    assert second == [BAD]  # ... but the in-flight step's reaches the client (the defect)
    assert list(r.output_token_ids) == [BAD]
    assert getattr(again.scheduled_cached_reqs, patch.REWOUND_FIELD, None) is None


def test_patched_drops_the_inflight_step_and_names_the_rewound_request(model_dir, run_dir):
    assert patch.apply_inflight().status == APPLIED
    assert patch.apply_rewind().status == APPLIED
    s = make_scheduler(model_dir)
    r = admit(s)
    first, second, again = fail_during_async_step(s, r)
    assert (first, second) == ([], [])
    assert list(r.output_token_ids) == []
    assert r.status == RequestStatus.RUNNING
    # the recompute: from the failed block to the prompt's end, no stale placeholder
    assert again.num_scheduled_tokens == {"r": PROMPT - FAILED * BLOCK}
    cached = again.scheduled_cached_reqs
    assert cached.req_ids == ["r"] and cached.num_computed_tokens == [FAILED * BLOCK]
    assert getattr(cached, patch.REWOUND_FIELD) == {"r"}
    assert cached.num_output_tokens == [0]  # the runner's total_len becomes the prompt's
    # the recovered step's token is the request's first output token
    out = s.update_from_output(again, runner_output(GOOD))
    assert delivered(out) == [GOOD] and list(r.output_token_ids) == [GOOD]
    # the mark is sent once
    assert getattr(s.schedule().scheduled_cached_reqs, patch.REWOUND_FIELD, None) is None
    events = [
        json.loads(x) for x in (run_dir / "events" / "kv_recovery.jsonl").read_text().splitlines()
    ]
    assert {e["patch"] for e in events} == {"kv_async_inflight"}
    # 0.32 drains stale output by scheduled tokens: the failed step's 32 and the decode's 1
    assert events[0]["requests"] == {"r": PROMPT - EXTERNAL + 1} and events[0]["unit"] == "tokens"


def test_policy_fail_is_left_to_vllm(model_dir, run_dir):
    patch.apply_inflight()
    patch.apply_rewind()
    s = make_scheduler(model_dir, "fail")
    r = admit(s)
    _first, second, again = fail_during_async_step(s, r)
    assert r.is_finished() and r.status == RequestStatus.FINISHED_ERROR
    assert second == [] and "r" not in again.num_scheduled_tokens
    assert not (run_dir / "events" / "kv_recovery.jsonl").exists()


def test_apply_is_idempotent_and_revert_restores_vllm(run_dir):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    before = (Scheduler._handle_invalid_blocks, Scheduler.schedule, GPUModelRunner.update_requests)
    for _ in range(2):
        patch.apply_inflight()
        patch.apply_rewind()
    handle = Scheduler._handle_invalid_blocks
    assert handle.__wrapped__.__wrapped__ is before[0]  # two wrappers, one per patch
    assert patch.apply_rewind().detail == "already applied in this process"
    patch.revert()
    after = (Scheduler._handle_invalid_blocks, Scheduler.schedule, GPUModelRunner.update_requests)
    assert after == before


def test_rules_read_the_sources():
    assert patch.rewind_rule({patch.HANDLE: "x", patch.RUNNER_UPDATE: "np[i] = n"})[0] is False
    fixed = "self.req_states.num_computed_tokens.stage_write_elem(i, n)"
    assert patch.rewind_rule({patch.HANDLE: "x", patch.RUNNER_UPDATE: fixed})[0] is True
    assert patch.rewind_rule({patch.HANDLE: "x", patch.RUNNER_UPDATE: None})[0] is None
    assert patch.inflight_rule({patch.HANDLE: "def f(): pass"})[0] is False
    rolled = "request.num_output_placeholders = 0"
    assert patch.inflight_rule({patch.HANDLE: "", patch.UPDATE_INVALID: rolled})[0] is True
    assert patch.inflight_rule({patch.HANDLE: None})[0] is None


def test_drop_inflight_on_vllm_026_counts_frames_after_the_failed_step():
    # 0.26's Request: async_tokens_to_discard, no stale-output counters
    r = SimpleNamespace(num_output_placeholders=2, async_tokens_to_discard=0)
    assert patch.drop_inflight(None, r, added_this_step=1) == (1, "frames")
    assert (r.async_tokens_to_discard, r.num_output_placeholders) == (1, 0)
    chunk = SimpleNamespace(num_output_placeholders=1, async_tokens_to_discard=0)
    assert patch.drop_inflight(None, chunk, added_this_step=0) == (1, "frames")  # N: a chunk


def _runner(prompt_len: int, total: int, computed: int, tokens: list[int]):
    vocab = 16
    states = SimpleNamespace(
        req_id_to_index={"r": 0},
        num_computed_tokens=SimpleNamespace(gpu=torch.tensor([computed], dtype=torch.int32)),
        total_len=SimpleNamespace(gpu=torch.tensor([total], dtype=torch.int32)),
        prompt_len=SimpleNamespace(np=np.array([prompt_len], dtype=np.int32)),
        all_token_ids=SimpleNamespace(gpu=torch.tensor([tokens], dtype=torch.int32)),
    )
    counts = torch.zeros(1, vocab, dtype=torch.int32)
    for t in tokens[prompt_len:total]:
        counts[0, t] += 1
    sampler = SimpleNamespace(penalties_state=SimpleNamespace(output_bin_counts=counts))
    return SimpleNamespace(req_states=states, sampler=sampler)


def test_runner_rewind_restores_count_length_and_bin_counts():
    # a 6-token prompt; the failed step sampled 9, the in-flight one 11: total 8, computed 7
    tokens = [1, 2, 3, 4, 5, 6, 9, 11, 0, 0]
    runner = _runner(prompt_len=6, total=8, computed=7, tokens=tokens)
    cached = SimpleNamespace(req_ids=["r"], num_computed_tokens=[2], num_output_tokens=[0])
    (record,) = patch.rewind_runner_state(runner, cached, {"r"})
    rs = runner.req_states
    assert int(rs.num_computed_tokens.gpu[0]) == 2
    assert int(rs.total_len.gpu[0]) == 6
    assert runner.sampler.penalties_state.output_bin_counts.sum().item() == 0
    assert record == {
        "req_id": "r",
        "device_computed": 7,
        "scheduler_computed": 2,
        "total_len": 6,
        "dropped_tokens": 2,
    }


def test_runner_rewind_touches_only_named_requests():
    runner = _runner(prompt_len=6, total=7, computed=6, tokens=[1, 2, 3, 4, 5, 6, 9, 0])
    cached = SimpleNamespace(req_ids=["r"], num_computed_tokens=[6], num_output_tokens=[1])
    assert patch.rewind_runner_state(runner, cached, {"other"}) == []
    assert int(runner.req_states.num_computed_tokens.gpu[0]) == 6
    assert int(runner.sampler.penalties_state.output_bin_counts.sum()) == 1
