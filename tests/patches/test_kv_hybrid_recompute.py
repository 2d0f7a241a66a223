"""The kv_hybrid_recompute patch against vLLM's real Scheduler (no engine).

Schedulers are built the way upstream's tests/v1/kv_connector/unit/utils.py builds
them (a VllmConfig, a KVCacheConfig of one or two groups, the real Scheduler), with a
mocked connector that reports a synchronous (or asynchronous) external hit, and a
ModelRunnerOutput carrying ``invalid_block_ids`` as a connector would.
"""

from __future__ import annotations

import json

import pytest
import torch
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from engine_patches.patches import kv_hybrid_recompute as patch
from engine_patches.registry import APPLIED, UPSTREAM
from tests.standins.kv_scheduler import (
    HmaConnector,
    attention,
    example_transfer,
    scheduler,
    vllm_config,
)

BLOCK = 16
WINDOW = 32
EOS = 2
PROMPT_BLOCKS = 8  # 128-token prompts
EXTERNAL_BLOCKS = 7  # 112 tokens "loaded" by the connector


@pytest.fixture
def patched():
    patch.revert()
    outcome = patch.apply()
    assert outcome.status == APPLIED, outcome
    yield
    patch.revert()


@pytest.fixture
def unpatched():
    patch.revert()
    yield


def make_scheduler(model_dir: str, groups: int, policy: str) -> Scheduler:
    config = vllm_config(
        model_dir,
        example_transfer(policy),
        block=BLOCK,
        max_num_seqs=16,
        max_num_batched_tokens=4096,
        max_model_len=4096,
    )
    full = attention(BLOCK)
    specs = [KVCacheGroupSpec(["full"], full)]
    if groups == 2:  # the tiny-hybrid layout: group 0 sliding window, group 1 full
        window = SlidingWindowSpec(
            block_size=BLOCK,
            num_kv_heads=1,
            head_size=1,
            dtype=torch.float32,
            sliding_window=WINDOW,
        )
        specs = [KVCacheGroupSpec(["swa"], window), KVCacheGroupSpec(["full"], full)]
    s = scheduler(config, specs, 1000)
    assert len(s.kv_cache_config.kv_cache_groups) == groups
    return s


def make_request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=8)
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def prompt(seed: int, n: int = PROMPT_BLOCKS * BLOCK) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 5 for i in range(n)]


def attach_connector(scheduler: Scheduler, matched: dict[str, int], async_load: bool = False):
    connector = HmaConnector()
    connector.get_num_new_matched_tokens.side_effect = lambda req, _n: (
        matched.get(req.request_id, 0),
        async_load and matched.get(req.request_id, 0) > 0,
    )
    connector.get_external_cache_hit_sources.side_effect = lambda req, n: {}
    connector.get_loaded_kv_cache_group_ids.return_value = tuple(
        range(len(scheduler.kv_cache_config.kv_cache_groups))
    )
    connector.request_finished.return_value = (False, None)
    connector.take_events.return_value = ()
    scheduler.connector = connector
    return connector


def runner_output(requests: list[Request], invalid: set[int]) -> ModelRunnerOutput:
    ids = [r.request_id for r in requests]
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[7] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=KVConnectorOutput(invalid_block_ids=invalid),
    )


def start(scheduler: Scheduler, requests: list[Request], matched: dict[str, int], **kw):
    attach_connector(scheduler, matched, **kw)
    for r in requests:
        scheduler.add_request(r)
    return scheduler.schedule()


def blocks(scheduler: Scheduler, request: Request) -> tuple[list[int], ...]:
    return scheduler.kv_cache_manager.get_block_ids(request.request_id)


def error_ids(outputs) -> set[str]:
    return {
        o.request_id
        for outs in outputs.values()
        for o in outs.outputs
        if o.finish_reason is not None and str(o.finish_reason).lower().endswith("error")
    }


# ---- the bug exists on this vLLM, and the patch knows it ---------------------------
def test_unpatched_multi_group_kills_the_scheduler(model_dir, unpatched):
    s = make_scheduler(model_dir, 2, "recompute")
    r = make_request("a", prompt(1))
    out = start(s, [r], {"a": EXTERNAL_BLOCKS * BLOCK})
    bad = blocks(s, r)[1][2]
    with pytest.raises((RuntimeError, ValueError)):
        s.update_from_output(out, runner_output([r], {bad}))


def test_detects_installed_scheduler_needs_the_patch(unpatched):
    handled, why = patch.upstream_handles_multi_group(Scheduler)
    assert handled is False and "several groups" in why


def test_detects_already_upstream_and_missing_target():
    class Fixed:
        def _handle_invalid_blocks(self, invalid_block_ids, num_scheduled_tokens):
            for _group_ids in self.kv_cache_manager.get_block_ids("x"):
                pass
            return set()

    class Missing:
        pass

    assert patch.upstream_handles_multi_group(Fixed)[0] is True
    assert patch.upstream_handles_multi_group(Missing)[0] is None


def test_apply_reports_already_upstream(monkeypatch, unpatched):
    monkeypatch.setattr(patch, "upstream_handles_multi_group", lambda cls: (True, "fixed"))
    outcome = patch.apply()
    assert outcome.status == UPSTREAM
    assert not getattr(Scheduler._handle_invalid_blocks, patch.MARK, False)


def test_apply_is_idempotent(patched):
    wrapped = Scheduler._handle_invalid_blocks
    assert patch.apply().detail == "already applied in this process"
    assert Scheduler._handle_invalid_blocks is wrapped


# ---- single group: exactly upstream's behaviour -------------------------------------
def _single_group_run(model_dir: str, policy: str):
    s = make_scheduler(model_dir, 1, policy)
    a, b = make_request("a", prompt(1)), make_request("b", prompt(1))  # b shares a's blocks
    c = make_request("c", prompt(2))
    out = start(s, [a, b, c], {"a": EXTERNAL_BLOCKS * BLOCK, "c": EXTERNAL_BLOCKS * BLOCK})
    bad = {blocks(s, a)[0][3], blocks(s, c)[0][5]}
    outputs = s.update_from_output(out, runner_output([a, b, c], bad))
    state = {r.request_id: (r.status, r.num_computed_tokens) for r in (a, b, c)}
    return state, error_ids(outputs), blocks(s, a)[0][3] if a.request_id in s.requests else None


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_single_group_unchanged(model_dir, policy):
    patch.revert()
    upstream = _single_group_run(model_dir, policy)
    assert patch.apply().status == APPLIED
    try:
        ours = _single_group_run(model_dir, policy)
    finally:
        patch.revert()
    assert ours == upstream
    state, errors, _ = ours
    if policy == "recompute":
        assert state["a"] == (RequestStatus.RUNNING, 3 * BLOCK)  # truncated at block 3
        assert state["c"] == (RequestStatus.RUNNING, 5 * BLOCK)
        assert errors == set()
    else:
        assert errors == {"a", "b", "c"}  # b shares a's failed block


# ---- several groups -----------------------------------------------------------------
@pytest.mark.parametrize("group", [0, 1])
def test_multi_group_recompute_restarts_affected_request(
    model_dir, patched, group, tmp_path, monkeypatch
):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    s = make_scheduler(model_dir, 2, "recompute")
    a, c = make_request("a", prompt(1)), make_request("c", prompt(2))
    out = start(s, [a, c], {"a": EXTERNAL_BLOCKS * BLOCK, "c": EXTERNAL_BLOCKS * BLOCK})
    a_blocks = blocks(s, a)
    null = s.kv_cache_manager.block_pool.null_block.block_id
    bad = next(b for b in a_blocks[group] if b != null)  # first real block of that group
    bad_block = s.kv_cache_manager.block_pool.blocks[bad]
    assert bad_block.block_hash is not None  # sync-loaded blocks are prefix-cached
    c_before = c.num_computed_tokens

    outputs = s.update_from_output(out, runner_output([a, c], {bad}))

    # engine alive, a restarts from scratch, c untouched
    assert error_ids(outputs) == set()
    assert a.status == RequestStatus.PREEMPTED and a.num_computed_tokens == 0
    assert a.skip_reading_prefix_cache is True
    assert a not in s.running and c in s.running
    assert c.status == RequestStatus.RUNNING and c.num_computed_tokens == c_before
    assert bad_block.block_hash is None  # never found again through the prefix cache
    # the next step recomputes the whole prompt on fresh blocks, without the connector
    again = s.schedule()
    assert again.num_scheduled_tokens["a"] == len(a.prompt_token_ids)
    assert all(b != null for group_ids in blocks(s, a) for b in group_ids)
    # the recovery is logged in vLLM's terms and in the run ledger
    events = [
        json.loads(x)
        for x in (tmp_path / "events" / "kv_recoveries.jsonl").read_text().splitlines()
    ]
    assert events[-1]["action"] == "recomputed" and events[-1]["requests"] == 1
    assert events[-1]["tokens"] == EXTERNAL_BLOCKS * BLOCK
    assert events[-1]["details"][0]["blocks"][0]["group"] == group


def test_multi_group_fail_policy_fails_only_affected(model_dir, patched):
    s = make_scheduler(model_dir, 2, "fail")
    a, c = make_request("a", prompt(1)), make_request("c", prompt(2))
    out = start(s, [a, c], {"a": EXTERNAL_BLOCKS * BLOCK, "c": EXTERNAL_BLOCKS * BLOCK})
    bad = blocks(s, a)[1][4]
    bad_block = s.kv_cache_manager.block_pool.blocks[bad]
    outputs = s.update_from_output(out, runner_output([a, c], {bad}))
    assert error_ids(outputs) == {"a"}
    assert a.status == RequestStatus.FINISHED_ERROR and "a" not in s.requests
    assert c.status == RequestStatus.RUNNING and c in s.running
    assert bad_block.block_hash is None  # evicted
    s.schedule()  # the scheduler carries on


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_multi_group_shared_block_reschedules_sharer(model_dir, patched, policy):
    s = make_scheduler(model_dir, 2, policy)
    a, b = make_request("a", prompt(1)), make_request("b", prompt(1))
    c = make_request("c", prompt(3))
    out = start(s, [a, b, c], {"a": EXTERNAL_BLOCKS * BLOCK})
    shared = set(blocks(s, a)[1]) & set(blocks(s, b)[1])
    bad = blocks(s, a)[1][2]
    assert bad in shared  # b got a's block through the prefix cache
    outputs = s.update_from_output(out, runner_output([a, b, c], {bad}))
    if policy == "fail":
        assert error_ids(outputs) == {"a", "b"}
    else:
        assert error_ids(outputs) == set()
        for r in (a, b):
            assert r.status == RequestStatus.PREEMPTED and r.num_computed_tokens == 0
    assert c.status == RequestStatus.RUNNING and c in s.running


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_null_block_never_fails_nor_is_evicted(model_dir, patched, policy):
    s = make_scheduler(model_dir, 2, policy)
    a = make_request("a", prompt(1))
    out = start(s, [a], {"a": EXTERNAL_BLOCKS * BLOCK})
    pool = s.kv_cache_manager.block_pool
    null = pool.null_block.block_id
    assert null in blocks(s, a)[0]  # positions that slid out of the window
    evicted: list[set[int]] = []
    original = s.kv_cache_manager.evict_blocks
    s.kv_cache_manager.evict_blocks = lambda ids: (evicted.append(set(ids)), original(ids))[1]
    computed = a.num_computed_tokens
    outputs = s.update_from_output(out, runner_output([a], {null}))
    assert error_ids(outputs) == set()
    assert a.status == RequestStatus.RUNNING and a.num_computed_tokens > 0
    assert a.num_computed_tokens == computed and len(a.output_token_ids) == 1  # output kept
    assert evicted == [] and pool.null_block.is_null
    # a real failure reported together with the null block: null still not evicted
    out2 = s.schedule()
    bad = blocks(s, a)[1][1]
    s.update_from_output(out2, runner_output([a], {null, bad}))
    assert evicted and all(null not in e for e in evicted)
    assert bad in set().union(*evicted)


def test_multi_group_async_load_failure_resets_request(model_dir, patched):
    s = make_scheduler(model_dir, 2, "recompute")
    a = make_request("a", prompt(1))
    out = start(s, [a], {"a": EXTERNAL_BLOCKS * BLOCK}, async_load=True)
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    bad = blocks(s, a)[1][3]
    s.update_from_output(out, runner_output([], {bad}))
    assert a.num_computed_tokens == 0 and a.skip_reading_prefix_cache is True
    assert "a" in s.failed_recving_kv_req_ids
    # the transfer ends: the request is released and recomputed from scratch
    done = runner_output([], set())
    done.kv_connector_output = KVConnectorOutput(finished_recving={"a"})
    s.update_from_output(s.schedule(), done)
    nxt = s.schedule()
    assert nxt.num_scheduled_tokens.get("a") == len(a.prompt_token_ids)
