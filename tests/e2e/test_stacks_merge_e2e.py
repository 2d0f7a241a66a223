"""Reports from several hosts merged into one verdict (issue 44 item 4), on a real TP=2
server whose ranks span two nodes (vLLM's multi-node layout on this machine:
tests/two_nodes.py): node 0 runs the API server, the EngineCore and Worker_TP0, node 1 a
headless server with Worker_TP1.

Worker_TP1 stopped under load: `opsctl stacks --json --host node-a` on node 0 sees
Worker_TP0 held in the all-reduce and says the rank it waits for is not among its
processes; `--host node-b` on node 1 sees Worker_TP1 stopped; `opsctl stacks --merge` of
the two reports names node-b's Worker_TP1 as the culprit and node-a's Worker_TP0 waiting
for it in the collective. Continued, every request answers.

Engine starts: 1 (two bare vLLM nodes: a multi-node server is not something opsctl starts)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from opsctl.collectors.processes import members
from tests.cli.test_json_schemas import validate
from tests.conftest import OPSCTL
from tests.engine_cores import ClosedLoad
from tests.two_nodes import two_nodes
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

BODY = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 48, "ignore_eos": True}


def opsctl(*args: str) -> tuple[int, dict]:
    r = subprocess.run([*OPSCTL, *args, "--json"], capture_output=True, text=True, timeout=300)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def nodes():
    from opsctl.engine.model import resolve

    with two_nodes(str(resolve("tiny-llama").path)) as server:
        yield server


def roles_of(pid: int) -> dict[str, int]:
    return {role: p for p, role, _state in members(pid)}


def test_the_merged_reports_of_two_hosts_name_the_stopped_rank_on_the_other(nodes, tmp_path):
    head, node = roles_of(nodes.head.pid), roles_of(nodes.worker_node.pid)
    assert {"EngineCore", "Worker_TP0"} <= set(head) and "Worker_TP1" not in head, head
    assert "Worker_TP1" in node and "Worker_TP0" not in node, node
    tp0, tp1 = head["Worker_TP0"], node["Worker_TP1"]
    load = ClosedLoad([nodes.url], 4, BODY).start()
    wait_until(lambda: load.done[nodes.url] >= 4, 300, "the load flowing")
    os.kill(tp1, signal.SIGSTOP)
    try:
        code, a = opsctl("stacks", nodes.url, "--host", "node-a")
        assert code == 1 and a["host"] == "node-a" and a["verdict"] == "stuck", a["headline"]
        assert a["culprits"] == [] and [w["role"] for w in a["waiting"]] == ["Worker_TP0"]
        assert "the rank they wait for is not among these processes" in a["headline"]
        code, b = opsctl("stacks", str(nodes.worker_node.pid), "--host", "node-b")
        assert code == 1 and b["host"] == "node-b", b["headline"]
        assert [(c["role"], c["status"]) for c in b["culprits"]] == [("Worker_TP1", "stopped")]
        files = []
        for name, doc in (("node-a", a), ("node-b", b)):
            (path := tmp_path / f"{name}.json").write_text(json.dumps(doc))
            files.append(str(path))
        code, merged = opsctl("stacks", "--merge", *files)
        validate(merged)
        assert code == 1 and merged["verdict"] == "stuck", merged["headline"]
        assert merged["hosts"] == ["node-a", "node-b"]
        assert [(c["host"], c["role"], c["pid"], c["status"]) for c in merged["culprits"]] == [
            ("node-b", "Worker_TP1", tp1, "stopped")
        ]
        assert [(w["host"], w["role"], w["status"]) for w in merged["waiting"]] == [
            ("node-a", "Worker_TP0", "collective")
        ]
        assert merged["headline"].startswith(f"node-b/Worker_TP1 (pid {tp1}) [stopped]: ")
        # the collective is the one Worker_TP1 was stopped before: the layers' all-reduce,
        # or (beside a CPU hog, stopped in the LM head) the logits' all-gather
        assert f"; node-a/Worker_TP0 (pid {tp0}) waits in " in merged["headline"]
        assert "(collective) under " in merged["headline"]
        assert "typing_extensions" not in merged["headline"], merged["headline"]
        r = subprocess.run([*OPSCTL, "stacks", "--merge", *files], capture_output=True, text=True)
        assert r.returncode == 1 and "stacks[/]" not in r.stdout
        assert (
            "stacks of 2 hosts: node-a" in r.stdout and f"node-b/Worker_TP1 (pid {tp1})" in r.stdout
        )
        held = load.done[nodes.url]
    finally:
        os.kill(tp1, signal.SIGCONT)
    wait_until(lambda: load.done[nodes.url] > held, 300, "answers again once continued")
    load.stop(300)
    assert load.failed == []
