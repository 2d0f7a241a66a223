"""`engram inspect` / `clean` against real shared tables built as vLLM builds them
(/dev/shm file, ftruncate, mmap MAP_SHARED, constant fill, N real mapping processes,
creator unlinks). No engine: these run in seconds. Every test uses its own name prefix
and tears its files and processes down (tests/engram_tables.py)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import time

import pytest
from engram_tables import shared_table, unique_prefix, write_byte

from opsctl.collectors import engram as col
from opsctl.domain import engram as dom

ROWS, DIM = 4096, 256
TOTAL = ROWS * DIM * 129 // 128


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
        assert not tab.linked and tab.size == TOTAL and tab.size_source == "map_files"
        assert tab.layout == dom.TableLayout(TOTAL, ROWS * DIM, ROWS * DIM // 128, 128)
        assert {m.pid for m in tab.mappers} == set(t.pids)
        for m in tab.mappers:
            assert m.deleted and m.error is None
            assert m.rss == TOTAL + (-TOTAL % 4096)  # every page touched, page-rounded
            assert abs(m.pss - TOTAL / n) <= 0.02 * TOTAL / n + 8192
        assert tab.verify.status == "constant" and tab.verify.bytes_checked == TOTAL
        findings = dom.table_findings(tab.to_dict())
        assert any(f.code == "engram.shared" for f in findings)


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
        (TOTAL - 1, 0, "scales"),
    ],
)
def test_corrupted_byte_reported_at_its_offset(offset, value, region):
    prefix = unique_prefix("bad")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        write_byte(t.path, offset, value)
        t.unlink()
        for access in (("map_files",), ("mem",)):
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
        deadline = time.monotonic() + 4
        rounds = 0
        while time.monotonic() < deadline:
            t.spawn(1)
            if rng.random() < 0.7 and len(t.pids) > 1:
                victim = rng.choice([c for c in t.children if c.poll() is None])
                with contextlib.suppress(Exception):
                    victim.kill()  # exits while inspect may be reading it
            snap = col.inspect(verify="full", prefix=prefix)
            assert only_table(snap, prefix).verify.status == "constant"
            rounds += 1
        assert rounds >= 3


def inspect_as_nobody(**kwargs) -> dict:
    """Run inspect in a forked child that dropped root for uid/gid 65534 (nobody)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            snap = col.inspect(**kwargs)
            doc = col.snapshot_to_dict(snap)
            found = dom.inspect_findings(
                doc["tables"], doc["scan_errors"], as_root=os.geteuid() == 0
            )
            doc["findings"] = [f.to_dict() for f in found]
            os.write(w, json.dumps(doc, default=str).encode())
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
            scan = col.find_orphans(prefix)
            assert [o.name for o in scan.orphans] == [os.path.basename(orphan)]
            assert t.name in scan.mapped and os.path.basename(link) in scan.symlinks
            removed, kept = col.remove_orphans(
                [o.name for o in scan.orphans] + [t.name, os.path.basename(link)], prefix
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
