"""The stacks renderer (opsctl/stacks/view.py) on documents built by the library's own
assembly from real-engine frames (tests/unit/test_stack_verdict.py): the verdict line
first, one line per process, the groups; a merged document names each rank's host."""

from __future__ import annotations

from rich.console import Console

from opsctl.stacks import judge_verdict as V
from opsctl.stacks.judge import group
from opsctl.stacks.view import render
from tests.unit.test_stack_verdict import IN_ALL_REDUCE, PLANTED, doc, proc, server


def shown(d: dict) -> str:
    con = Console(record=True, width=400, color_system=None)
    render(con, d)
    return con.export_text()


def test_one_host_verdict_first_then_processes_and_groups():
    procs = server(proc(11, "Worker_TP0", IN_ALL_REDUCE), proc(12, "Worker_TP1", PLANTED))
    found = V.diagnose(procs)
    d = {
        "pid": 1, "host": "node-a", "interval": 1.0, "seconds": 1.2, **found.fields(),
        "processes": [p.to_dict() for p in procs], "groups": [g.to_dict() for g in group(procs)],
    }  # fmt: skip
    lines = shown(d).splitlines()
    assert lines[0] == "stacks of pid 1 on node-a (5 processes, two takes 1.0 s apart, 1.2 s)"
    assert lines[1] == f"stuck: {found.headline}"
    assert lines[2] == "  APIServer (pid 1): in run (uvloop/__init__.py:92)"
    assert any(line.startswith("1 thread(s): Worker_TP1 12") for line in lines)


def test_a_merged_document_names_each_rank_with_its_host():
    a, b = (
        doc("node-a", proc(11, "Worker_TP0", IN_ALL_REDUCE)),
        doc("node-b", proc(12, "Worker_TP1", PLANTED)),
    )
    procs, reports = V.merge([("a.json", a), ("b.json", b)])
    for r, f in zip(reports, ("a.json", "b.json"), strict=True):
        assert r["file"] == f
    d = {"reports": reports, **V.diagnose(procs).fields(), "processes": [p.to_dict() for p in procs],
         "groups": [g.to_dict() for g in group(procs)]}  # fmt: skip
    text = shown(d)
    assert text.startswith(
        "stacks of 2 hosts: node-a (a.json), node-b (b.json)\nstuck: node-b/Worker_TP1 (pid 12) stuck"
    )
    assert "  node-a/Worker_TP0 (pid 11): waits in all_reduce" in text
    assert "1 thread(s): node-b/Worker_TP1 12" in text
