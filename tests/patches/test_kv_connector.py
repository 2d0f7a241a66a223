"""FaultInjectingConnector against vLLM's real config objects, with small KV tensors:
every group's blocks round-trip, the null block is skipped, an injected block is
reported once, corrupted, and logged; the scheduler side finds stored prefixes; a plan
that opsctl's collector writes is adopted by content (two writes within one mtime tick
both count), a malformed one is recorded once and the plan kept. Under tensor parallelism
each rank stores and loads its own part (its KV heads), the scheduler offers a prefix
once every rank stored it, and every rank fails the same blocks."""

from __future__ import annotations

import json
import os

import pytest
import torch
from vllm import SamplingParams
from vllm.config import (
    KVTransferConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

from engine_patches.connectors.fault_kv import FaultInjectingConnector, FaultKVMetadata, Transfer
from engine_patches.connectors.injection import (
    CONNECTOR_NAME,
    MODULE_PATH,
    InjectionPlan,
    kv_transfer_config,
    prefix_key,
)
from opsctl.suite.kv_fail.collect import write_control
from tests.standins.kv_scheduler import attention, vllm_config

BS = 16
NUM_BLOCKS = 16


@pytest.fixture
def setup(tmp_path, monkeypatch):
    from opsctl.engine.model import resolve

    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path / "run"))
    kv_transfer = KVTransferConfig(
        kv_connector=CONNECTOR_NAME,
        kv_connector_module_path=MODULE_PATH,
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "storage_path": str(tmp_path / "store"),
            "inject": {"enabled": False},
        },
    )
    config = vllm_config(
        str(resolve("tiny-hybrid").path),
        kv_transfer,
        block=BS,
        max_num_seqs=4,
        max_num_batched_tokens=1024,
        max_model_len=256,
        prefix_caching=None,
    )
    swa = SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float32, sliding_window=32
    )
    full = attention(BS, head_size=8)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], swa), KVCacheGroupSpec(["l1"], full)],
    )
    return config, kv_cache_config, tmp_path


def test_round_trip_every_group_and_injection(setup):
    vllm_config, kv_cache_config, tmp = setup
    assert supports_hma(FaultInjectingConnector)
    conn = FaultInjectingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    kv = {name: torch.randn(NUM_BLOCKS, 2, BS, 8) for name in ("l0", "l1")}
    conn.register_kv_caches(kv)
    original = {k: v.clone() for k, v in kv.items()}
    tokens = list(range(10, 10 + 3 * BS + 5))
    key = prefix_key(tokens[: 3 * BS])

    conn.bind_connector_metadata(
        FaultKVMetadata(stores=[Transfer("r1", key, ([1, 2, 3], [4, 5, 6]), 0, 3 * BS)])
    )
    conn.wait_for_save()
    conn.clear_connector_metadata()
    assert (tmp / "store" / key / "rank0" / "meta.json").is_file()

    for t in kv.values():
        t.zero_()
    write_control(tmp / "store", InjectionPlan(blocks="1:-1", epoch="t"))
    # group 0 position 0 slid out of the window: the null block
    load = Transfer("r2", key, ([0, 7, 8], [9, 10, 11]), 0, 3 * BS)
    conn.bind_connector_metadata(FaultKVMetadata(loads=[load]))
    conn.start_load_kv(None)
    conn.clear_connector_metadata()

    assert torch.equal(kv["l0"][7], original["l0"][2]) and torch.equal(
        kv["l0"][8], original["l0"][3]
    )
    assert torch.equal(kv["l1"][9], original["l1"][4]) and torch.equal(
        kv["l1"][10], original["l1"][5]
    )
    assert not torch.equal(kv["l1"][11], original["l1"][6])  # injected -> corrupted
    assert not kv["l0"][0].any()  # null block never written
    assert conn.get_block_ids_with_load_errors() == {11}
    assert conn.get_block_ids_with_load_errors() == set()  # reported once
    events = [
        json.loads(x)
        for x in (tmp / "run" / "events" / "kv_injections.jsonl").read_text().splitlines()
    ]
    assert [
        (e["request_id"], e["group"], e["block"], e["position"], e["epoch"]) for e in events
    ] == [("r2", 1, 11, 2, "t")]


def test_missing_stored_block_is_reported(setup):
    vllm_config, kv_cache_config, _tmp = setup
    conn = FaultInjectingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    conn.register_kv_caches({name: torch.zeros(NUM_BLOCKS, 2, BS, 8) for name in ("l0", "l1")})
    conn.bind_connector_metadata(FaultKVMetadata(loads=[Transfer("r", "nokey", ([1], [2]), 0, BS)]))
    conn.start_load_kv(None)
    assert conn.get_block_ids_with_load_errors() == {1, 2}


def request_a(tokens: list[int]) -> Request:
    """Request "a" over ``tokens``, two tokens to generate."""
    return Request(
        request_id="a",
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=2),
        pooling_params=None,
        mm_features=None,
    )


def test_scheduler_side_matches_stored_prefix(setup):
    vllm_config, kv_cache_config, tmp = setup
    conn = FaultInjectingConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    tokens = list(range(10, 10 + 2 * BS + 3))
    req = request_a(tokens)
    assert conn.get_num_new_matched_tokens(req, 0) == (0, False)
    folder = tmp / "store" / prefix_key(tokens[: 2 * BS]) / "rank0"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    assert conn.get_num_new_matched_tokens(req, 0) == (2 * BS, False)
    assert conn.get_num_new_matched_tokens(req, BS) == (BS, False)
    assert conn.get_loaded_kv_cache_group_ids(req) == (0, 1)


def _load_nothing(conn) -> None:
    """One load step (of a prefix that is not stored): the connector reads its plan."""
    conn.bind_connector_metadata(FaultKVMetadata(loads=[Transfer("r", "nokey", ([1], [2]), 0, BS)]))
    conn.start_load_kv(None)
    conn.clear_connector_metadata()


def test_control_file_is_adopted_by_content_not_mtime(setup):
    vllm_config, kv_cache_config, tmp = setup
    conn = FaultInjectingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    conn.register_kv_caches({name: torch.zeros(NUM_BLOCKS, 2, BS, 8) for name in ("l0", "l1")})
    store, control = tmp / "store", tmp / "store" / "control.json"
    assert not conn.plan.active  # the --kv-transfer-config plan: nothing injected
    write_control(store, InjectionPlan(blocks="0", epoch="first"))
    _load_nothing(conn)
    assert conn.plan.epoch == "first" and conn.plan.active
    stamp = control.stat().st_mtime_ns
    write_control(store, InjectionPlan(enabled=False, epoch="second"))
    os.utime(control, ns=(stamp, stamp))  # a coarse file system: the same mtime
    _load_nothing(conn)
    assert conn.plan.epoch == "second" and not conn.plan.active

    control.write_text("{not json")
    _load_nothing(conn)
    _load_nothing(conn)
    assert conn.plan.epoch == "second"  # kept
    events = (tmp / "run" / "events" / "kv_connector.jsonl").read_text().splitlines()
    assert sum("control_error" in line for line in events) == 1


def test_kv_transfer_config_is_what_the_connector_reads():
    cfg = json.loads(kv_transfer_config("/s", policy="fail"))
    assert (cfg["kv_connector"], cfg["kv_connector_module_path"]) == (CONNECTOR_NAME, MODULE_PATH)
    assert cfg["kv_load_failure_policy"] == "fail" and cfg["kv_role"] == "kv_both"
    extra = cfg["kv_connector_extra_config"]
    assert extra["storage_path"] == "/s"
    assert InjectionPlan.from_json(extra["inject"]) == InjectionPlan(enabled=False)


def test_each_tp_rank_keeps_its_own_part_and_all_fail_the_same_blocks(setup, monkeypatch):
    """TP=2: two workers, each with its own KV heads (different tensors). On main both
    wrote one folder: the first rank's part won and the other rank reloaded its heads."""
    import engine_patches.connectors.fault_kv as fk

    vllm_config, kv_cache_config, tmp = setup
    vllm_config.parallel_config.tensor_parallel_size = 2
    workers, kvs = [], []
    for rank in (0, 1):
        monkeypatch.setattr(fk, "worker_rank", lambda tp, rank=rank: rank)
        conn = FaultInjectingConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        kv = {name: torch.randn(NUM_BLOCKS, 2, BS, 8) for name in ("l0", "l1")}
        conn.register_kv_caches(kv)
        workers.append(conn)
        kvs.append(kv)
    assert [w.rank for w in workers] == [0, 1] and workers[0].world == 2
    originals = [{k: v.clone() for k, v in kv.items()} for kv in kvs]
    sched = FaultInjectingConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
    tokens = list(range(10, 10 + 2 * BS + 3))
    key = prefix_key(tokens[: 2 * BS])
    req = request_a(tokens)
    store = Transfer("r1", key, ([1, 2], [3, 4]), 0, 2 * BS)
    for n, conn in enumerate(workers):
        assert sched.get_num_new_matched_tokens(req, 0) == (0, False)  # not every rank yet
        conn.bind_connector_metadata(FaultKVMetadata(stores=[store]))
        conn.wait_for_save()
        conn.clear_connector_metadata()
        assert (tmp / "store" / key / f"rank{n}" / "meta.json").is_file()
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS, False)

    write_control(tmp / "store", InjectionPlan(blocks="1:-1", epoch="t"))
    for conn, kv in zip(workers, kvs, strict=True):
        for t in kv.values():
            t.zero_()
        conn.bind_connector_metadata(
            FaultKVMetadata(loads=[Transfer("r2", key, ([5, 6], [7, 8]), 0, 2 * BS)])
        )
        conn.start_load_kv(None)
        conn.clear_connector_metadata()
    for kv, original in zip(kvs, originals, strict=True):  # each rank got its own heads back
        assert torch.equal(kv["l0"][5], original["l0"][1])
        assert torch.equal(kv["l1"][7], original["l1"][3])
    assert [w.get_block_ids_with_load_errors() for w in workers] == [{8}, {8}]
    events = [
        json.loads(x)
        for x in (tmp / "run" / "events" / "kv_injections.jsonl").read_text().splitlines()
    ]
    assert sorted((e["rank"], e["group"], e["block"], e["position"]) for e in events) == [
        (0, 1, 8, 1),
        (1, 1, 8, 1),
    ]
