"""Pure Engram logic: table layout split, sampling, findings, plan arithmetic."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from opsctl.errors import BadInput
from opsctl.suite.engram import judge as dom
from opsctl.suite.engram import judge_plan as ep

GIB = 1024**3


def table_bytes(rows: int, dim: int, block: int) -> bytearray:
    """A dummy-filled table exactly as vLLM 0.32 lays it out (weights, then scales)."""
    weight = rows * dim
    return bytearray(b"\x38" * weight + b"\x7f" * (weight // block))


def seen(data: bytes) -> dict:
    """The bytes the collector reads for decide_layout: the windows the domain asks for."""
    windows = dom.boundary_windows(len(data))
    assert windows, "only an ambiguous size needs data"
    return {(o, n): bytes(data[o : o + n]) for o, n in windows}


@pytest.mark.parametrize(
    "rows,dim,block",
    [(4096, 256, 32), (1000, 256, 32), (7, 512, 32), (4096, 256, 128), (1, 128, 128)],
)
def test_split_recovers_rows_times_dim_when_one_block_fits(rows, dim, block):
    total = rows * dim + rows * dim // block
    assert [c.block for c in dom.candidate_layouts(total)] == [block]
    lay = dom.split_table(total)
    assert lay is not None and lay.block == block
    assert (lay.weight_bytes, lay.scale_bytes) == (rows * dim, rows * dim // block)
    w, s = lay.regions()
    assert (w.start, w.end, w.value) == (0, rows * dim, 0x38)
    assert (s.start, s.end, s.value) == (rows * dim, total, 127)
    d = dom.decide_layout(total)
    assert d.layout == lay and d.how == "size" and d.candidates == (block,)


def test_vllm_default_block_is_32():
    assert dom.DEFAULT_BLOCK == 32 and dom.BLOCKS[0] == 32
    assert ep.DEFAULT_BLOCK == 32


@pytest.mark.parametrize("total", [0, 1, 4096, 129 * 127 + 1, 10**9 + 7])
def test_split_rejects_non_tables(total):
    assert dom.split_table(total) is None
    d = dom.decide_layout(total)
    assert d.layout is None and d.how == "none"


# 4300 rows x 256 with 32-blocks and 4400 rows x 256 with 128-blocks are both 1,135,200
# bytes: the size fits both, only the data tells them apart. (The real layer-1 table,
# 384,006,168 rows, is a multiple of 43 too.)
AMBIGUOUS = 1_135_200


def test_ambiguous_size_32_block_table_is_decided_from_the_data():
    data = table_bytes(4300, 256, 32)
    assert len(data) == AMBIGUOUS and 384006168 % 43 == 0
    assert [c.block for c in dom.candidate_layouts(AMBIGUOUS)] == [32, 128]
    d = dom.decide_layout(AMBIGUOUS, seen(data))
    assert d.how == "data" and d.layout.block == 32 and d.candidates == (32, 128)
    assert d.layout.weight_bytes == 4300 * 256 and "B=32" in d.detail
    # the bug this replaces: a 128 split puts ue8m0 bytes (127) in the weight region
    w128 = dom.split_table(AMBIGUOUS, (128,)).weight_bytes
    assert data[w128 - 1] == 127


def test_ambiguous_size_128_block_table_is_decided_from_the_data():
    data = table_bytes(4400, 256, 128)
    assert len(data) == AMBIGUOUS
    d = dom.decide_layout(AMBIGUOUS, seen(data))
    assert d.how == "data" and d.layout.block == 128 and d.layout.weight_bytes == 4400 * 256


def test_ambiguous_size_without_data_or_inconsistent_data_defaults_to_32():
    d = dom.decide_layout(AMBIGUOUS, None)
    assert d.how == "default" and d.layout.block == 32 and "could not be read" in d.detail
    d = dom.decide_layout(AMBIGUOUS, seen(bytes(AMBIGUOUS)))  # all zero: tells nothing
    assert d.how == "default" and d.layout.block == 32 and "vLLM 0.32" in d.detail


def test_forced_block_size():
    d = dom.decide_layout(AMBIGUOUS, seen(table_bytes(4300, 256, 32)), forced=128)
    assert d.how == "forced" and d.layout.block == 128
    d = dom.decide_layout(4096 * 264, None, forced=128)  # a 32-table that does not fit 128
    assert d.layout is None and d.how == "forced" and "128" in d.detail


def test_boundary_windows_only_for_an_ambiguous_unforced_size():
    assert dom.boundary_windows(4096 * 264) == ()  # only B=32 fits: the size decides
    assert dom.boundary_windows(AMBIGUOUS, forced=128) == ()
    assert dom.boundary_windows(None) == () and dom.boundary_windows(0) == ()
    windows = dom.boundary_windows(AMBIGUOUS)
    assert len(windows) == 4 and all(n == dom.PROBE_BYTES for _, n in windows)
    # a window the collector could not read tells nothing: the 32 default, not a guess
    data = seen(table_bytes(4400, 256, 128))
    partial = {w: b for w, b in data.items() if w[0] not in (4400 * 256, 4400 * 256 - 4096)}
    d = dom.decide_layout(AMBIGUOUS, partial)
    assert d.how == "default" and d.layout.block == 32


def test_scale_like_bytes():
    rng = np.random.default_rng(0)
    assert dom.looks_like_scales(b"\x7f" * 64)
    assert dom.looks_like_scales(bytes(rng.integers(112, 126, 4096, dtype=np.uint8)))
    assert not dom.looks_like_scales(b"\x38" * 64)  # dummy fp8 weights
    # real fp8 e4m3 weights have both signs: bytes on both sides of 0x80
    weights = rng.normal(0, 0.05, 4096)
    mag = np.clip(np.log2(np.abs(weights) + 1e-9) + 7, 0, 15).astype(np.uint8) << 3
    fp8 = np.where(weights < 0, 0x80, 0).astype(np.uint8) | mag
    assert not dom.looks_like_scales(fp8.tobytes())
    assert not dom.looks_like_scales(b"") and not dom.looks_like_scales(b"\x7f\xff")


def test_size_from_page_rounded_mapping_uses_the_last_page():
    data = table_bytes(4300, 256, 32)  # 1,135,200 bytes: mapping rounds up to 1,138,688
    vma = len(data) + (-len(data) % 4096)
    tail = bytes(data[vma - 4096 :]) + bytes(vma - len(data))  # past EOF reads as 0
    assert dom.size_from_mapping(vma, tail[-4096:]) == AMBIGUOUS
    aligned = table_bytes(4096, 256, 32)  # 1,081,344 = 264 pages exactly
    assert dom.size_from_mapping(len(aligned), bytes(aligned[-4096:])) == len(aligned)
    assert dom.size_from_mapping(vma, None) is None  # never guessed
    assert dom.size_from_mapping(vma, bytes(4096)) is None
    assert dom.size_from_mapping(8192, b"\x7f" * 4096 + bytes(0)) is None  # fits no block


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
        "size_bytes": 10,
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
        "verify": {"status": "constant", "mode": "sample", "checked_bytes": 1, "access": "file"},
    }
    assert dom.exit_status(dom.inspect_findings([ok], [])) == 0
    assert dom.exit_status(dom.inspect_findings([], [])) == 0
    # --pid: a linked file no listed process maps is not known to be an orphan
    assert "engram.orphan" in {x.code for x in dom.inspect_findings([ok], [])}
    assert "engram.orphan" not in {x.code for x in dom.inspect_findings([ok], [], pids_given=True)}


@pytest.mark.parametrize(
    "verify,code",
    [
        ({"status": "denied", "mode": "full", "error": "permission denied", "hint": "h"}, 1),
        ({"status": "error", "mode": "sample", "error": "table ends at byte 5"}, 1),
        ({"status": "unverifiable", "mode": "full", "reason": "table size not known"}, 1),
        ({"status": "skipped", "mode": "none"}, 0),
        ({"status": "skipped", "mode": "full", "reason": "every process ... exited"}, 0),
    ],
)
def test_verification_that_could_not_complete_exits_1(verify, code):
    table = {"name": "vllm_engram_y", "size_bytes": 33, "layout": None, "linked": False}
    table.update(mappers=[{"pid": 9, "rss_bytes": 1, "pss_bytes": 1}], verify=verify)
    found = dom.inspect_findings([table], [])
    assert dom.exit_status(found) == code
    inc = [f for f in found if f.code == "engram.verify_incomplete"]
    assert bool(inc) == bool(code)
    if inc:
        assert inc[0].severity == "fail" and "vllm_engram_y" in inc[0].message


def test_block_size_decision_is_a_finding_when_the_size_did_not_decide():
    lay = {"total_bytes": AMBIGUOUS, "weight_bytes": 4300 * 256, "scale_bytes": 34400, "block": 32}
    table = {"name": "vllm_engram_z", "size_bytes": AMBIGUOUS, "layout": lay, "linked": True}
    table.update(mappers=[{"pid": 9, "rss_bytes": 1, "pss_bytes": 1}], verify={"status": "skipped"})
    for how, severity in (("data", "info"), ("default", "warning")):
        table["block_choice"] = {"block": 32, "how": how, "detail": "d", "candidates": [32, 128]}
        (f,) = [x for x in dom.table_findings(table) if x.code == "engram.block_size"]
        assert f.severity == severity and "B=32" in f.message
    table["block_choice"]["how"] = "size"
    assert not [x for x in dom.table_findings(table) if x.code == "engram.block_size"]


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


def test_block_32_default_like_vllm_and_overrides():
    cfg = {k: v for k, v in example().items() if k != "engram_scale_block_size"}
    spec = ep.spec_from_config(cfg)  # no opsctl key: vLLM 0.32's 32-element blocks
    assert spec.block == 32 and spec.row_bytes == 264 and "default" in spec.block_source
    assert round(ep.make_plan(spec).total_bytes / GIB, 1) == 188.8
    forced = ep.spec_from_config(example(), block=128)  # --block-size beats the config key
    assert forced.block == 128 and forced.block_source == "--block-size"
    assert round(ep.make_plan(forced).total_bytes / GIB, 2) == 184.54
    keyed = ep.spec_from_config({**cfg, "engram_scale_block_size": 128})
    assert keyed.block == 128 and "config" in keyed.block_source


@pytest.mark.parametrize("block", [0, -32])
def test_non_positive_block_size_is_bad_input(block):
    with pytest.raises(ep.PlanError, match="positive"):
        ep.spec_from_config(example(), block=block)
    with pytest.raises(ep.PlanError, match="positive"):
        ep.spec_from_config({**example(), "engram_scale_block_size": block})


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


# ---- inspect failure line, options and the clean rules -----------------------------------------


def test_inspect_failure_line_names_the_mismatch_first():
    mismatch = dom.Finding(dom.FAIL, "engram.fill_mismatch", "t1: not constant")
    incomplete = dom.Finding(dom.FAIL, "engram.verify_incomplete", "could not complete for 1")
    ok = dom.Finding(dom.OK, "engram.fill_constant", "t0: constant")
    assert dom.inspect_failure([ok]) is None
    assert dom.inspect_failure([ok, incomplete]) == "could not complete for 1"
    line = dom.inspect_failure([incomplete, mismatch])
    assert line == "1 Engram table(s) not constant-filled: t1: not constant"


@pytest.mark.parametrize("prefix", ["psm_", "vllm_engram_/x", "", "/dev/shm/vllm_engram_"])
def test_foreign_prefix_is_bad_input(prefix):
    with pytest.raises(BadInput, match="--prefix"):
        dom.check_prefix(prefix)
    assert dom.check_prefix("vllm_engram_run1_") == "vllm_engram_run1_"


def test_option_checks():
    with pytest.raises(BadInput, match="--verify"):
        dom.check_inspect_options("quick", dom.PREFIX, None)
    with pytest.raises(BadInput, match="--block-size"):
        dom.check_inspect_options("full", dom.PREFIX, 0)
    dom.check_inspect_options("none", dom.PREFIX, 128)
    with pytest.raises(BadInput, match="--force only makes sense with --yes"):
        dom.check_clean_options(dom.PREFIX, yes=False, force=True, min_age=0)
    with pytest.raises(BadInput, match="--min-age"):
        dom.check_clean_options(dom.PREFIX, yes=True, force=False, min_age=-1)
    dom.check_clean_options(dom.PREFIX, yes=True, force=True, min_age=0)


def test_clean_refusal_rule():
    kept, denied = ["vllm_engram_a"], (41, 42)
    line = dom.clean_refusal(True, kept, denied, force=False)
    assert line is not None and "2 process(es)" in line and "--force" in line
    assert dom.clean_refusal(True, kept, denied, force=True) is None  # forced: not refused
    assert dom.clean_refusal(False, kept, denied, force=False) is None  # dry run
    assert dom.clean_refusal(True, [], denied, force=False) is None  # nothing kept
    assert dom.clean_refusal(True, kept, (), force=False) is None  # kept for another reason


def test_clean_failure_hint_and_warning():
    refused = dom.clean_refusal(True, ["a"], (7,), False)
    assert dom.clean_failure(True, ["a"], refused) == refused
    assert dom.clean_failure(True, ["a", "b"], None) == (
        "2 orphan(s) kept (held again, gone, or not removable): a, b"
    )
    assert (
        dom.clean_failure(True, [], None) is None and dom.clean_failure(False, ["a"], None) is None
    )
    assert dom.clean_hint(False, 3) == "3 orphan(s) listed; run again with --yes to remove them"
    assert dom.clean_hint(True, 3) is None and dom.clean_hint(False, 0) is None
    assert dom.unreadable_warning(()) is None
    assert "pids 1, 2" in (dom.unreadable_warning((1, 2)) or "")
