"""`engram inspect` / `clean` against real shared tables built as vLLM 0.32 builds them
(/dev/shm file, ftruncate to rows*dim*(1+1/32), mmap MAP_SHARED, constant fill, N real
mapping processes, creator unlinks). No engine: these run in seconds. Every test uses
its own name prefix and tears its files and processes down (tests/engram_tables.py).

Privilege: as root, deleted tables are sized and read through /proc/PID/map_files; as
another user (own processes) through /proc/PID/mem with the size taken from the
mapping's last page. Tests accept either path; only the asserts that need root
(map_files, dropping to uid nobody) are marked ``needs_root``."""

from __future__ import annotations

import contextlib
import json
import os
import random

import pytest
from engram_tables import shared_table, shm_file, unique_prefix, write_byte

from opsctl.suite.engram import collect as col
from opsctl.suite.engram import collect_clean as clean_col
from opsctl.suite.engram import judge as dom

ROWS, DIM = 4096, 256
TOTAL = ROWS * DIM * 33 // 32  # vLLM 0.32: 32-element ue8m0 blocks
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not ROOT, reason="needs root: /proc/PID/map_files (CAP_SYS_ADMIN) or setuid to nobody"
)
DELETED_SOURCES = ("map_files", "mapping")  # as root map_files, else the mem path


def only_table(snap, prefix):
    tables = [t for t in snap.tables if t.name.startswith(prefix)]
    assert len(tables) == 1, [t.name for t in snap.tables]
    return tables[0]


@pytest.mark.parametrize("n", [2, 4])
def test_deleted_table_one_group_n_mappers_pss_is_size_over_n(n):
    prefix = unique_prefix("pss")
    with shared_table(prefix, rows=ROWS, dim=DIM, mappers=n) as t:
        snap = col.inspect(verify="full", prefix=prefix)
        tab = only_table(snap, prefix)
        assert not tab.linked and tab.size == TOTAL and tab.size_source in DELETED_SOURCES
        assert tab.layout == dom.TableLayout(TOTAL, ROWS * DIM, ROWS * DIM // 32, 32)
        assert tab.block_choice["how"] == "size"  # 4096 rows: only B=32 fits
        assert {m.pid for m in tab.mappers} == set(t.pids)
        for m in tab.mappers:
            assert m.deleted and m.error is None
            assert m.rss == TOTAL + (-TOTAL % 4096)  # every page touched, page-rounded
            assert abs(m.pss - TOTAL / n) <= 0.02 * TOTAL / n + 8192
        assert tab.verify.status == "constant" and tab.verify.bytes_checked == TOTAL
        findings = dom.table_findings(tab.to_dict())
        assert any(f.code == "engram.shared" for f in findings)


@needs_root
def test_as_root_deleted_table_is_sized_and_read_through_map_files():
    prefix = unique_prefix("mapf")
    with shared_table(prefix, rows=ROWS, dim=DIM, mappers=2):
        tab = only_table(col.inspect(verify="full", prefix=prefix), prefix)
        assert tab.size_source == "map_files" and tab.verify.access == "map_files"
        assert tab.size == TOTAL and tab.verify.status == "constant"


AMBIG_ROWS = 4300  # 43*100: 4300*264 bytes also fits 128-element blocks (= 4400*258)


@pytest.mark.parametrize("access", [col.ACCESS, ("mem",)], ids=["default", "mem-only"])
def test_32_block_table_whose_size_also_fits_128_is_split_as_vllm_does(access):
    """The size fits B=32 and B=128; the data decides 32. mem-only: no map_files, so the
    size is inferred from the page-rounded mapping's last page."""
    prefix = unique_prefix("amb")
    total = AMBIG_ROWS * DIM * 33 // 32
    assert total % 129 == 0 and total % 4096  # fits 128 too; mapping is page-rounded
    with shared_table(prefix, rows=AMBIG_ROWS, dim=DIM, mappers=2) as t:
        snap = col.inspect(verify="full", prefix=prefix, access=access)
        tab = only_table(snap, prefix)
        if access == ("mem",):
            assert tab.size_source == "mapping" and tab.verify.access == "mem"
        assert tab.size == total == t.total
        assert tab.layout == dom.TableLayout(total, AMBIG_ROWS * DIM, AMBIG_ROWS * DIM // 32, 32)
        assert tab.block_choice["how"] == "data" and tab.block_choice["candidates"] == [32, 128]
        assert tab.verify.status == "constant" and tab.verify.bytes_checked == total
        doc = col.snapshot_to_dict(snap)
        found = dom.inspect_findings(doc["tables"], doc["scan_errors"])
        assert dom.exit_status(found) == 0
        assert any(f.code == "engram.block_size" and "B=32" in f.message for f in found)
        # forcing 128 reproduces the old mis-split: the first scale byte lands in "weights"
        snap = col.inspect(verify="full", prefix=prefix, access=access, block=128)
        tab = only_table(snap, prefix)
        assert tab.block_choice["how"] == "forced" and tab.layout.block == 128
        assert tab.verify.first_mismatch == {
            "offset": AMBIG_ROWS * DIM,
            "value": 127,
            "expected": 0x38,
            "region": "weights",
        }


@pytest.mark.parametrize("rows", [4096, 4400], ids=["size-decides", "data-decides"])
def test_128_block_tables_are_still_recognised(rows):
    prefix = unique_prefix("b128")
    total = rows * DIM * 129 // 128
    with shared_table(prefix, rows=rows, dim=DIM, mappers=2, block=128):
        tab = only_table(col.inspect(verify="full", prefix=prefix, access=("mem",)), prefix)
        assert tab.size == total and tab.layout.block == 128
        assert tab.block_choice["how"] == ("size" if rows == 4096 else "data")
        assert tab.verify.status == "constant" and tab.verify.bytes_checked == total


def test_linked_table_and_its_mappings_are_one_table_and_pid_filter_works():
    prefix = unique_prefix("lnk")
    with shared_table(prefix, mappers=3, unlink=False) as t:
        snap = col.inspect(verify="sample", prefix=prefix)
        tab = only_table(snap, prefix)
        assert tab.linked and tab.size_source == "file" and len(tab.mappers) == 3
        assert tab.verify.status == "constant" and tab.verify.access == "file"
        assert snap.capacity.total > 0 and snap.capacity.free <= snap.capacity.total
        some = t.pids[:2]
        snap2 = col.inspect(pids=some, verify="none", prefix=prefix)
        assert {m.pid for m in only_table(snap2, prefix).mappers} == set(some)
        assert only_table(snap2, prefix).verify.status == "skipped"


@pytest.mark.parametrize(
    "offset,value,region",
    [
        (0, 0x00, "weights"),
        (123_457, 0x39, "weights"),
        (ROWS * DIM, 0x7E, "scales"),
        (TOTAL - 1, 0x80, "scales"),
    ],
)
def test_corrupted_byte_reported_at_its_offset(offset, value, region):
    prefix = unique_prefix("bad")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        write_byte(t.path, offset, value)
        t.unlink()
        for access in (("map_files",), ("mem",)) if ROOT else (("mem",),):
            snap = col.inspect(verify="full", prefix=prefix, access=access)
            v = only_table(snap, prefix).verify
            assert v.status == "mismatch" and v.access == access[0]
            expected = 0x38 if region == "weights" else 127
            assert v.first_mismatch == {
                "offset": offset,
                "value": value,
                "expected": expected,
                "region": region,
            }
        doc = col.snapshot_to_dict(snap)
        findings = dom.inspect_findings(doc["tables"], doc["scan_errors"])
        assert dom.exit_status(findings) == 1
        assert any(f.code == "engram.fill_mismatch" and str(offset) in f.message for f in findings)


def test_zero_last_byte_via_mem_only_is_unverifiable_not_guessed():
    """The mem path sizes a deleted table by its last non-zero byte; a zeroed last scale
    byte leaves no valid size, which is reported (exit 1), never guessed."""
    prefix = unique_prefix("zero")
    with shared_table(prefix, mappers=1, unlink=False) as t:
        write_byte(t.path, TOTAL - 1, 0)
        t.unlink()
        snap = col.inspect(verify="full", prefix=prefix, access=("mem",))
        tab = only_table(snap, prefix)
        assert tab.size is None and tab.size_source == "unknown"
        assert tab.verify.status == "unverifiable"
        doc = col.snapshot_to_dict(snap)
        assert dom.exit_status(dom.inspect_findings(doc["tables"], doc["scan_errors"])) == 1


def test_sample_mode_catches_boundary_corruption_and_reads_little():
    prefix = unique_prefix("smp")
    rows = 64 * 1024  # 16 MiB of weights: sample reads a fraction
    with shared_table(prefix, rows=rows, mappers=1, unlink=False) as t:
        snap = col.inspect(verify="sample", prefix=prefix)
        v = only_table(snap, prefix).verify
        assert v.status == "constant" and v.bytes_checked < t.total // 2
        write_byte(t.path, rows * DIM - 1, 0x11)  # last weight byte, just before the scales
        v = only_table(col.inspect(verify="sample", prefix=prefix), prefix).verify
        assert v.first_mismatch["offset"] == rows * DIM - 1


def test_process_exiting_mid_scan_does_not_crash():
    prefix = unique_prefix("exit")
    with shared_table(prefix, mappers=3) as t:
        victim = t.children[0]

        def kill_one(stage, _data):
            if stage == "maps":
                t.stop(victim)

        snap = col.inspect(verify="full", prefix=prefix, progress=kill_one)
        tab = only_table(snap, prefix)
        gone = [m for m in tab.mappers if m.pid == victim.pid]
        assert gone and gone[0].error and gone[0].rss is None
        assert tab.verify.status == "constant"  # read through a surviving mapper

        def kill_all(stage, _data):
            if stage == "maps":
                for c in t.children:
                    t.stop(c)

        snap = col.inspect(verify="full", prefix=prefix, progress=kill_all)
        tab = only_table(snap, prefix)
        assert tab.verify.status == "skipped" and "exited" in tab.verify.reason


def test_churning_mappers_never_crash_inspect():
    prefix = unique_prefix("churn")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        rng = random.Random(7)
        for _ in range(12):  # a fixed number of rounds: no wall-clock budget to miss
            t.spawn(1)
            if rng.random() < 0.7 and len(t.pids) > 1:
                victim = rng.choice([c for c in t.children if c.poll() is None])
                with contextlib.suppress(Exception):
                    victim.kill()  # exits while inspect may be reading it
            snap = col.inspect(verify="full", prefix=prefix)
            assert only_table(snap, prefix).verify.status == "constant"


def as_nobody(fn) -> dict:
    """Run ``fn()`` in a forked child that dropped root for uid/gid 65534 (nobody); its
    JSON-able result comes back through a pipe. Root only."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, json.dumps(fn(), default=str).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


def inspect_as_nobody(**kwargs) -> dict:
    def run() -> dict:
        doc = col.snapshot_to_dict(col.inspect(**kwargs))
        found = dom.inspect_findings(doc["tables"], doc["scan_errors"], as_root=False)
        doc["findings"] = [f.to_dict() for f in found]
        doc["exit_status"] = dom.exit_status(found)
        return doc

    return as_nobody(run)


@needs_root
def test_permission_problems_are_findings_with_a_hint():
    """As an unprivileged user: root's mappings and a root-only table cannot be read."""
    prefix = unique_prefix("perm")
    with (
        shared_table(prefix, mappers=2, unlink=False, suffix="linked") as t,
        shared_table(prefix, mappers=2, suffix="deleted") as d,
    ):
        doc = inspect_as_nobody(pids=[d.pids[0], t.pids[0]], verify="full", prefix=prefix)
        linked = [x for x in doc["tables"] if x["name"] == t.name]
        assert linked and linked[0]["verify"]["status"] == "denied" and linked[0]["verify"]["hint"]
        assert {e["pid"] for e in doc["scan_errors"]} >= {d.pids[0], t.pids[0]}
        perm = [f for f in doc["findings"] if f["code"] == "engram.permission"]
        assert len(perm) >= 2 and all(f["details"].get("hint") for f in perm)
        assert "run as root" in perm[0]["details"]["hint"]
        assert doc["exit_status"] == 1  # verification requested, could not complete
        assert any(f["code"] == "engram.verify_incomplete" for f in doc["findings"])


@needs_root
def test_clean_keeps_orphans_while_some_maps_are_unreadable_unless_forced():
    """As nobody, root's processes' maps cannot be read: an orphan is kept (a file only
    they map would look the same) until force=True."""
    prefix = unique_prefix("deny")
    orphan = f"/dev/shm/{prefix}orphan"
    with open(orphan, "wb") as fh:
        fh.write(b"\x7f" * 33)
    os.chown(orphan, 65534, 65534)  # /dev/shm is sticky: nobody may remove only its own
    try:

        def run() -> dict:
            kept_run = clean_col.remove_orphans([os.path.basename(orphan)], prefix, min_age=0)
            exists = os.path.exists(orphan)
            forced = clean_col.remove_orphans(
                [os.path.basename(orphan)], prefix, force=True, min_age=0
            )
            return {"first": kept_run, "exists_after_first": exists, "forced": forced}

        out = as_nobody(run)
        removed, kept, denied = out["first"]
        assert removed == [] and kept == [os.path.basename(orphan)] and denied
        assert out["exists_after_first"]
        assert out["forced"][0] == [os.path.basename(orphan)] and not os.path.exists(orphan)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(orphan)


def test_clean_lists_then_removes_orphans_only():
    from opsctl.collectors import shm

    prefix = unique_prefix("cln")
    orphan = f"/dev/shm/{prefix}orphan"
    outside = f"/tmp/{prefix}outside"
    link = f"/dev/shm/{prefix}link"
    with shared_table(prefix, mappers=1, unlink=False, suffix="mapped") as t:
        try:
            with open(orphan, "wb") as fh:
                fh.write(b"\x38" * 4096)
            with open(outside, "wb") as fh:
                fh.write(b"x")
            os.symlink(outside, link)
            scan = clean_col.find_orphans(prefix, min_age=0)  # fresh files: no minimum age here
            assert [o.name for o in scan.orphans] == [os.path.basename(orphan)]
            assert t.name in scan.mapped and os.path.basename(link) in scan.symlinks
            removed, kept, _denied = clean_col.remove_orphans(
                [o.name for o in scan.orphans] + [t.name, os.path.basename(link)],
                prefix,
                force=True,  # other users' processes on this node may be unreadable
                min_age=0,
            )
            assert removed == [os.path.basename(orphan)]
            assert not os.path.exists(orphan)
            assert os.path.exists(t.path) and os.path.islink(link) and os.path.exists(outside)
            assert {os.path.basename(link), t.name} <= set(kept)
            assert shm.list_files(prefix=prefix)  # the mapped file and the link are still there
        finally:
            for p in (orphan, link, outside):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)


# ---- the library entry points (opsctl.suite.engram.run_tables), called directly ----------------


def test_check_inspect_report_events_and_failure_line():
    from opsctl.checks import events as ev
    from opsctl.suite.engram import run_tables as engram

    prefix = unique_prefix("chk")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        events: list = []
        report = engram.inspect(engram.InspectOptions(verify="full", prefix=prefix), events.append)
        assert report.verdict == "pass" and report.failure is None
        doc = report.to_dict()
        assert doc["schema"] == "opsctl.engram.inspect/2" and doc["exit_code"] == 0
        assert [x["name"] for x in doc["tables"]] == [t.name]
        phases = [e.name for e in events if isinstance(e, ev.Phase)]
        assert phases[0] == "scanning /dev/shm and /proc/*/maps" and "verifying (full)" in phases
        (done,) = [e for e in events if isinstance(e, ev.Finished)]
        assert done.verdict == "pass" and done.rows[0][0] == t.name and events[-1] is done
        write_byte(t.path, 3, 0x00)  # a weight byte
        report = engram.inspect(engram.InspectOptions(verify="full", prefix=prefix))
        assert report.verdict == "fail" and report.to_dict()["exit_code"] == 1
        assert report.failure.startswith("1 Engram table(s) not constant-filled")


def test_check_inspect_and_clean_refuse_bad_options_before_any_io():
    from opsctl.errors import BadInput
    from opsctl.suite.engram import run_tables as engram

    with pytest.raises(BadInput, match="--prefix"):
        engram.CleanOptions(prefix="")  # would be every /dev/shm file
    with pytest.raises(BadInput, match="--verify"):
        engram.InspectOptions(verify="quick")
    with pytest.raises(BadInput, match="no such process: 999999999"):
        engram.inspect(engram.InspectOptions(pids=(999999999,)))


def test_check_plan_from_the_shipped_example():
    from opsctl.errors import BadInput
    from opsctl.suite.engram import run_tables as engram

    opts = engram.PlanOptions(config="deepseek-v4.1-flash", tp=4, dp=2, shm_size="200G")
    report = engram.plan(opts)
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.engram.plan/2"
    assert doc["chosen"] == "shared" and doc["source"] == "example:deepseek-v4.1-flash"
    with pytest.raises(BadInput, match="exactly one"):
        engram.plan(engram.PlanOptions())


def test_check_clean_dry_run_then_yes():
    from opsctl.suite.engram import run_tables as engram

    prefix = unique_prefix("chkcln")
    with shm_file(f"{prefix}orphan", b"\x38" * 4096) as orphan:
        dry = engram.clean(engram.CleanOptions(prefix=prefix, min_age=0))
        assert dry.verdict == "pass" and dry.to_dict()["dry_run"] and os.path.exists(orphan)
        assert [o["name"] for o in dry.to_dict()["orphans"]] == [os.path.basename(orphan)]
        assert dry.hint == "1 orphan(s) listed; run again with --yes to remove them"
        assert bool(dry.warnings) == bool(dry.to_dict()["unchecked_pids"])
        # force: other users' processes on this node may be unreadable (refusal: CLI tests)
        done = engram.clean(engram.CleanOptions(prefix=prefix, yes=True, force=True, min_age=0))
        assert done.verdict == "pass" and done.failure is None and done.hint is None
        assert done.to_dict()["removed"] == [os.path.basename(orphan)]
        assert not os.path.exists(orphan)
