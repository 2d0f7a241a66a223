"""Conformance of the kv_hybrid_recompute patch with upstream's hybrid recovery
contract (vLLM's tests/v1/kv_connector/unit/test_hybrid_kv_load_failure_recovery.py),
on vLLM 0.32's real Scheduler with an attention group plus a Mamba state group in
``align`` mode. The four upstream cases, written for this project:

1. a failed attention block: the request replays from zero (preempted, nothing
   computed, prefix cache not read), its blocks freed;
2. a failure reported at a Mamba position that holds the null block in ``align``
   mode: the request replays from zero as well, the null block is neither marked
   nor evicted, the states computed on top of that position are evicted;
3. an async (WAITING_FOR_REMOTE_KVS) failure: only the failed request is reset
   and released as a failed receive, a sibling that loaded fine keeps its tokens;
4. policy ``fail``: the affected request finishes with an error, nothing replays.
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
    MambaSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from engine_patches.patches import kv_hybrid_recompute as patch
from engine_patches.registry import APPLIED
from tests.standins.kv_scheduler import (
    HmaConnector,
    attention,
    example_transfer,
    scheduler,
    vllm_config,
)

BLOCK = 16
PROMPT = 20 * BLOCK  # 320 tokens
EXTERNAL = 19 * BLOCK  # 304 tokens "loaded" by the connector
BATCH = 64  # tokens per step: a replay from zero is chunked
EOS = 2
ATTN, STATE = 0, 1  # group order of the layout


@pytest.fixture(autouse=True)
def patched(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    patch.revert()
    assert patch.apply().status == APPLIED
    yield
    patch.revert()


def make_scheduler(model_dir: str, policy: str) -> Scheduler:
    config = vllm_config(
        model_dir,
        example_transfer(policy),
        block=BLOCK,
        max_num_seqs=8,
        max_num_batched_tokens=BATCH,
        max_model_len=512,
    )
    state = MambaSpec(
        block_size=BLOCK, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )
    groups = [KVCacheGroupSpec(["attn"], attention(BLOCK)), KVCacheGroupSpec(["ssm"], state)]
    return scheduler(config, groups, 400)


def make_request(rid: str, seed: int) -> Request:
    params = SamplingParams(max_tokens=8)
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=rid,
        prompt_token_ids=[(seed * 37 + i * 11) % 250 + 5 for i in range(PROMPT)],
        sampling_params=params,
        pooling_params=None,
        mm_features=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def start(scheduler: Scheduler, requests: list[Request], *, async_load: bool = False):
    """Admit ``requests`` with an external hit of EXTERNAL tokens each; one step."""
    connector = HmaConnector()
    connector.get_num_new_matched_tokens.side_effect = lambda req, _n: (EXTERNAL, async_load)
    connector.get_external_cache_hit_sources.side_effect = lambda req, n: {}
    connector.get_loaded_kv_cache_group_ids.return_value = (ATTN, STATE)
    connector.request_finished.return_value = (False, None)
    connector.take_events.return_value = ()
    scheduler.connector = connector
    for r in requests:
        scheduler.add_request(r)
    return scheduler.schedule()


def output(requests: list[Request], invalid: set[int], recved: set[str] | None = None):
    """The step's model output: every request samples EOS (it would finish if its
    load were taken as good); the connector reports ``invalid``."""
    ids = [r.request_id for r in requests]
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[EOS] for _ in ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=KVConnectorOutput(invalid_block_ids=invalid, finished_recving=recved),
    )


def blocks(scheduler: Scheduler, request: Request) -> tuple[list[int], ...]:
    return scheduler.kv_cache_manager.get_block_ids(request.request_id)


def delivered(outputs) -> dict[str, object]:
    """request id -> finish reason (None: still running) of every output delivered."""
    return {o.request_id: o.finish_reason for outs in outputs.values() for o in outs.outputs}


def spy_evictions(scheduler: Scheduler) -> list[set[int]]:
    calls: list[set[int]] = []
    original = scheduler.kv_cache_manager.evict_blocks
    scheduler.kv_cache_manager.evict_blocks = lambda ids: (calls.append(set(ids)), original(ids))[1]
    return calls


def last_recovery(run_dir) -> dict:
    lines = (run_dir / "events" / "kv_recoveries.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def assert_replays_from_zero(scheduler: Scheduler, request: Request, outputs) -> None:
    assert request not in scheduler.running
    assert scheduler.waiting.peek_request() is request
    assert request.status == RequestStatus.PREEMPTED
    assert request.num_computed_tokens == 0
    assert request.skip_reading_prefix_cache is True
    assert request.request_id not in delivered(outputs)  # the EOS of the bad step is dropped


# ---- the layout is the one upstream's test uses --------------------------------------
def test_layout_attention_plus_mamba_align(model_dir):
    s = make_scheduler(model_dir, "recompute")
    a = make_request("a", 1)
    start(s, [a])
    null = s.kv_cache_manager.block_pool.null_block.block_id
    attn, state = blocks(s, a)
    assert isinstance(s.kv_cache_config.kv_cache_groups[STATE].kv_cache_spec, MambaSpec)
    assert null not in attn and len(attn) == PROMPT // BLOCK
    # align mode: positions before the latest states hold the null block
    assert state[: EXTERNAL // BLOCK - 1] == [null] * (EXTERNAL // BLOCK - 1)
    assert all(b != null for b in state[EXTERNAL // BLOCK - 1 :])


# ---- case 1: a failed attention block --------------------------------------------------
def test_attention_failure_replays_from_zero(model_dir, tmp_path):
    s = make_scheduler(model_dir, "recompute")
    a = make_request("a", 1)
    out = start(s, [a])
    attn, _ = blocks(s, a)
    bad = s.kv_cache_manager.block_pool.blocks[attn[10]]
    assert bad.block_hash is not None  # a sync-loaded block is prefix-cached

    outputs = s.update_from_output(out, output([a], {attn[10]}))

    assert_replays_from_zero(s, a, outputs)
    pool = s.kv_cache_manager.block_pool
    assert all(pool.blocks[b].ref_cnt == 0 for b in attn)  # freed by the preemption
    assert bad.block_hash is None  # never found again through the prefix cache
    event = last_recovery(tmp_path)
    assert event["action"] == "recomputed" and event["tokens"] == EXTERNAL
    assert event["details"][0]["blocks"] == [
        {"group": ATTN, "position": 10, "block": attn[10], "shared": False}
    ]
    # the next step starts the prompt again, on fresh blocks, without the connector
    again = s.schedule()
    assert again.num_scheduled_tokens["a"] == BATCH and a.num_computed_tokens == BATCH
    # the connector is never asked again (0.26 does not gate it on skip_reading_prefix_cache:
    # the failed KV was loaded and failed for ever there)
    asked = s.connector.get_num_new_matched_tokens.__wrapped__.call_count
    assert s.connector.get_num_new_matched_tokens(a, 0) == (0, False)
    assert s.connector.get_num_new_matched_tokens.__wrapped__.call_count == asked


# ---- case 2: a failure reported at a Mamba position holding the null block -----------
@pytest.mark.parametrize("position", [0, 9, EXTERNAL // BLOCK - 2])
def test_state_failure_on_null_position_replays_from_zero(model_dir, tmp_path, position):
    s = make_scheduler(model_dir, "recompute")
    a = make_request("a", 1)
    out = start(s, [a])
    pool = s.kv_cache_manager.block_pool
    null = pool.null_block.block_id
    attn, state = blocks(s, a)
    assert state[position] == null
    states = [b for b in state if b != null]  # the states computed on top of it
    assert states and all(pool.blocks[b].block_hash is not None for b in states)
    evictions = spy_evictions(s)

    outputs = s.update_from_output(out, output([a], {null}))

    assert_replays_from_zero(s, a, outputs)
    assert all(pool.blocks[b].ref_cnt == 0 for b in attn)
    # the null block: never evicted, never counted as a failed block
    assert evictions and all(null not in e for e in evictions)
    assert pool.null_block.is_null
    assert all(pool.blocks[b].block_hash is None for b in states)
    hits = last_recovery(tmp_path)["details"][0]["blocks"]
    assert {h["group"] for h in hits} == {STATE}
    assert all(h["block"] == null and h["null"] and not h["shared"] for h in hits)
    again = s.schedule()
    assert again.num_scheduled_tokens["a"] == BATCH


def test_state_failure_on_real_state_block_replays_from_zero(model_dir):
    s = make_scheduler(model_dir, "recompute")
    a = make_request("a", 1)
    out = start(s, [a])
    null = s.kv_cache_manager.block_pool.null_block.block_id
    _, state = blocks(s, a)
    latest = state[EXTERNAL // BLOCK - 1]  # the state at the end of the loaded prefix
    assert latest != null
    outputs = s.update_from_output(out, output([a], {latest}))
    assert_replays_from_zero(s, a, outputs)
    assert s.kv_cache_manager.block_pool.blocks[latest].block_hash is None


def test_state_null_failure_with_fail_policy_fails_the_request(model_dir):
    s = make_scheduler(model_dir, "fail")
    a = make_request("a", 1)
    out = start(s, [a])
    pool = s.kv_cache_manager.block_pool
    evictions = spy_evictions(s)
    outputs = s.update_from_output(out, output([a], {pool.null_block.block_id}))
    assert a.status == RequestStatus.FINISHED_ERROR
    assert str(delivered(outputs)["a"]).lower().endswith("error")
    assert all(pool.null_block.block_id not in e for e in evictions)


# ---- case 3: an async load failure -----------------------------------------------------
def test_async_failure_resets_only_the_failed_request(model_dir):
    s = make_scheduler(model_dir, "recompute")
    good, bad = make_request("good", 1), make_request("bad", 2)
    out = start(s, [good, bad], async_load=True)
    assert len(s.kv_holding_waiting) == 2
    assert {r.status for r in (good, bad)} == {RequestStatus.WAITING_FOR_REMOTE_KVS}
    attn, _ = blocks(s, bad)
    evictions = spy_evictions(s)

    s.update_from_output(out, output([], {attn[10]}, recved={"good"}))

    assert bad.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert bad.num_computed_tokens == 0 and bad.skip_reading_prefix_cache is True
    assert s.failed_recving_kv_req_ids == {"bad"}
    assert evictions == []  # async blocks were never cached
    assert good.num_computed_tokens == EXTERNAL and good.skip_reading_prefix_cache is False
    # the failed transfer ends: released, then recomputed from the first token
    step = s.schedule()
    assert "bad" not in step.num_scheduled_tokens  # its transfer is still running
    s.update_from_output(step, output([good], set(), recved={"bad"}))
    nxt = s.schedule()
    assert bad.request_id in nxt.num_scheduled_tokens
    assert bad.num_computed_tokens == nxt.num_scheduled_tokens["bad"] <= BATCH


# ---- case 4: policy fail ----------------------------------------------------------------
def test_fail_policy_reports_error_without_replay(model_dir):
    s = make_scheduler(model_dir, "fail")
    a, c = make_request("a", 1), make_request("c", 2)
    out = start(s, [a, c])
    attn, _ = blocks(s, a)
    bad = s.kv_cache_manager.block_pool.blocks[attn[10]]
    c_computed = c.num_computed_tokens

    outputs = s.update_from_output(out, output([a, c], {attn[10]}))

    assert a.status == RequestStatus.FINISHED_ERROR
    assert str(delivered(outputs)["a"]).lower().endswith("error")
    assert "a" in s.finished_req_ids and "a" not in s.requests
    assert len(s.waiting) == 0  # nothing preempted for a replay
    assert bad.block_hash is None
    # c's load was good: it took its step (EOS) like any other request
    assert c.num_computed_tokens == c_computed and c.status == RequestStatus.FINISHED_STOPPED
    s.schedule()  # the scheduler carries on
