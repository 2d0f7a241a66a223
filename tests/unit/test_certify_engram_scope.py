"""certify's Engram hygiene judges the server under check, not its neighbours: a table
mapped only by another process of the node (another server's, e.g. one still being filled,
which reads "not constant") is named and left out, never a failure of this server. Seen on
2026-12-06: `certify URL` on a DP=2 server failed `engram.fill_mismatch` on a table another
test process was writing at that moment.

Real /dev/shm tables mapped by real processes (tests/engram_tables.py), engram inspect as
certify runs it; the server's processes found as certify finds them (its pid, or the
process listening on the URL's port, and every descendant)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

from engram_tables import planting, shared_table, unique_prefix, write_byte

from opsctl.checks.target import Live
from opsctl.suite.engram import judge_hygiene as dom
from opsctl.suite.engram import run_tables as tables
from opsctl.suite.engram.run import server_pids
from tests.waiting import wait_until


def test_another_servers_table_is_named_not_judged():
    with planting():
        prefix = unique_prefix("scope")
        with (
            shared_table(prefix, mappers=1, unlink=False, suffix="a") as ours,
            shared_table(prefix, mappers=1, unlink=False, suffix="b") as theirs,
        ):
            write_byte(theirs.path, 4096 * 256 + 3, 0x7E)  # "not constant": mid-fill
            doc = tables.inspect(tables.InspectOptions(prefix=prefix, verify="full")).to_dict()
            codes = {f["details"].get("table"): f["code"] for f in doc["findings"]}
            assert codes[theirs.name] == "engram.fill_mismatch", doc["findings"]
            # the whole node: the other server's table fails this one
            _, said, others = dom.server_tables(doc["tables"], doc["findings"], ())
            assert others == [] and "fail" in {f["severity"] for f in said}
            # the server's own processes: its table judged, the other named, not judged
            pids = server_pids(Live("http://10.0.0.1:1", server=SimpleNamespace(pid=ours.pids[0])))
            assert pids == (ours.pids[0],)
            mine, said, others = dom.server_tables(doc["tables"], doc["findings"], pids)
            assert [t["name"] for t in mine] == [ours.name] and others == [theirs.name]
            found = dom.engram_findings(said, [], None, others)
            assert "fail" not in {f.severity for f in found}, found  # (a warning: /proc/1)
            assert ("engram.fill_constant", ours.name) in {
                (f.code, f.details.get("table")) for f in found
            }, found
            (note,) = [f for f in found if f.code == "engram.other_servers"]
            assert theirs.name in note.message and note.details == {"tables": [theirs.name]}


def test_a_servers_processes_found_from_its_local_port_with_descendants():
    """No EngineServer (a server opsctl did not start): the listening process and its
    children; a remote URL: none (every table of the node is judged)."""
    code = (
        "import socket, subprocess, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(s.getsockname()[1], c.pid, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        port, child = map(int, proc.stdout.readline().split())
        got = wait_until(
            lambda: (p := server_pids(Live(f"http://127.0.0.1:{port}"))) and child in p and p,
            30,
            "the listener and its child",
        )
        assert got[0] == proc.pid and set(got) == {proc.pid, child}
        assert server_pids(Live("http://10.0.0.1:8000")) == ()  # parsed, never contacted
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait(10)
