"""Pure Engram logic: table layout split, sampling, findings, plan arithmetic."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from opsctl.domain import engram as dom
from opsctl.domain import engram_plan as ep

GIB = 1024**3


@pytest.mark.parametrize(
    "rows,dim,block",
    [(4096, 256, 128), (1, 128, 128), (384006168, 256, 128), (1000, 256, 32), (7, 512, 32)],
)
def test_split_recovers_rows_times_dim(rows, dim, block):
    total = rows * dim + rows * dim // block
    lay = dom.split_table(total)
    assert lay is not None and lay.block == block
    assert (lay.weight_bytes, lay.scale_bytes) == (rows * dim, rows * dim // block)
    w, s = lay.regions()
    assert (w.start, w.end, w.value) == (0, rows * dim, 0x38)
    assert (s.start, s.end, s.value) == (rows * dim, total, 127)


@pytest.mark.parametrize("total", [0, 1, 4096, 129 * 127 + 1, 10**9 + 7])
def test_split_rejects_non_tables(total):
    assert dom.split_table(total) is None


def test_size_from_page_rounded_mapping():
    total = 4096 * 256 * 129 // 128  # 1056768: page aligned
    assert dom.size_from_mapping(total) == total
    odd = 3 * 128 * 129  # 49536 bytes: mapping rounds up to 53248
    assert dom.size_from_mapping(53248) == odd


def test_sample_windows_cover_both_ends_of_each_region():
    lay = dom.split_table(64 * 1024 * 256 * 129 // 128)
    wins = dom.sample_windows(lay, windows=8, window_bytes=4096)
    for region in lay.regions():
        mine = [w for w in wins if w.name == region.name]
        assert mine[0].start == region.start and mine[-1].end == region.end
        assert all(region.start <= w.start < w.end <= region.end for w in mine)
    assert dom.verify_plan(lay, "none") == []
    assert dom.verify_plan(lay, "full") == list(lay.regions())


def test_first_mismatch():
    assert dom.first_mismatch(b"\x38" * 100, 0x38) is None
    assert dom.first_mismatch(b"\x38" * 50 + b"\x00" + b"\x38", 0x38) == 50


def test_findings_and_exit_status():
    table = {
        "name": "vllm_engram_x",
        "size": 10,
        "layout": None,
        "linked": True,
        "mappers": [],
        "verify": {
            "status": "mismatch",
            "mode": "full",
            "first_mismatch": {"offset": 7, "value": 0, "expected": 0x38, "region": "weights"},
        },
    }
    f = dom.inspect_findings(
        [table], [{"pid": 5, "reason": "permission denied reading /proc/5/maps"}]
    )
    codes = {x.code for x in f}
    assert {
        "engram.layout_unknown",
        "engram.orphan",
        "engram.fill_mismatch",
        "engram.permission",
    } <= codes
    assert dom.exit_status(f) == 1
    perm = next(x for x in f if x.code == "engram.permission")
    assert perm.details["hint"] and perm.details["pids"] == [5]
    ok = {
        **table,
        "layout": {},
        "verify": {"status": "constant", "mode": "sample", "bytes_checked": 1, "access": "file"},
    }
    assert dom.exit_status(dom.inspect_findings([ok], [])) == 0
    assert dom.exit_status(dom.inspect_findings([], [])) == 0


# ---- plan ---------------------------------------------------------------------------------


def example() -> dict:
    ref = resources.files("opsctl") / "data" / "deepseek-v4.1-flash-engram.json"
    return json.loads(ref.read_text())


def test_example_reproduces_published_rows_and_188_8_gib():
    spec = ep.spec_from_config(example())
    sizes, exact = ep.head_sizes(spec)
    assert exact and [sum(s) for s in sizes] == [
        384006168,
        384016682,
    ]  # vLLM's primes from vocab 16M
    plan = ep.make_plan(spec, tp=1, dp=1, shm_free=None)
    assert plan.total_bytes == 768022850 * (256 + 256 // 32)
    assert round(plan.total_bytes / GIB, 1) == 188.8
    tp4 = ep.make_plan(spec, tp=4)
    assert (
        round(tp4.placements[0].per_rank_bytes / GIB, 1) == 47.2
    )  # PR 57491: 47.2 GiB per rank at TP=4


def test_block_128_default_and_override():
    cfg = {k: v for k, v in example().items() if k != "engram_scale_block_size"}
    spec = ep.spec_from_config(cfg)
    assert spec.block == 128 and spec.row_bytes == 258
    assert ep.spec_from_config(example(), block=128).block == 128
    assert round(ep.make_plan(spec).total_bytes / GIB, 2) == 184.54


def test_shared_vs_fallback_decision():
    spec = ep.spec_from_config(example())
    total = spec.total_bytes
    shared = ep.make_plan(spec, tp=2, dp=4, shm_free=total + 1)
    assert shared.chosen == "shared" and shared.engram_dp == 4 and shared.fits_shm
    sp = {p.name: p for p in shared.placements}
    assert sp["shared"].per_node_bytes == total and sp["shared"].shm_bytes == total
    assert sp["shared"].files_per_node == 2 * 2  # one per layer and TP shard
    assert sp["private"].per_node_bytes == 4 * total
    assert sp["dp-sharded"].shards == 8 and sp["dp-sharded"].shm_bytes == 0
    docker = ep.make_plan(spec, tp=2, dp=4, shm_free=64 << 20)
    assert docker.chosen == "dp-sharded" and docker.fits_shm is False and "shm" in docker.reason
    assert ep.make_plan(spec, tp=8, dp=1).chosen == "private"
    spread = ep.make_plan(spec, tp=1, dp=4, nodes=4, shm_free=total * 2)
    assert spread.engram_dp == 1 and spread.chosen == "private" and "co-located" in spread.reason


def test_shard_rows_and_too_many_shards():
    assert ep.shard_rows((1, 2, 3, 4, 5), 2) == [6, 9]
    with pytest.raises(ep.PlanError):
        ep.shard_rows(tuple(range(24)), 25)  # ranks without heads
    spec = ep.spec_from_config(example())
    with pytest.raises(ep.PlanError):
        ep.make_plan(spec, tp=16, dp=2)  # 24 heads over 32 shards


@pytest.mark.parametrize(
    "cfg,msg",
    [
        ({}, "missing"),
        ({**example(), "engram_layer_ids": []}, "empty"),
        ({**example(), "engram_num_embeddings": [1, 2, 3]}, "entries"),
        ({**example(), "engram_head_dim": 100}, "multiple"),
    ],
)
def test_bad_configs(cfg, msg):
    with pytest.raises(ep.PlanError, match=msg):
        ep.spec_from_config(cfg)


def test_text_config_nesting_and_even_split_fallback():
    cfg = {
        "architectures": ["X"],
        "text_config": {
            k: v
            for k, v in example().items()
            if k.startswith("engram_") and k != "engram_vocab_size"
        },
    }
    spec = ep.spec_from_config(cfg)
    plan = ep.make_plan(spec, tp=4)
    assert not plan.exact_heads and plan.notes
    assert plan.total_bytes == 768022850 * 264


@pytest.mark.parametrize(
    "text,value",
    [
        ("64M", 64 << 20),
        ("200G", 200 << 30),
        ("188.8GiB", int(188.8 * GIB)),
        ("1024", 1024),
        ("2t", 2 << 40),
    ],
)
def test_parse_size(text, value):
    assert ep.parse_size(text) == value


def test_parse_size_rejects_garbage():
    with pytest.raises(ep.PlanError):
        ep.parse_size("lots")
