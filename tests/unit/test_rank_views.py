"""Every view names the ranks (issue 44, item 2), without an engine: the ledger's ranks
from its records' titles (records as vLLM 0.32 wrote them on this machine), the process
tree in rank order and a stopped rank named by its rank, on real processes titled as
vLLM titles them (setproctitle), and GPU telemetry per rank process (recorded NVML
readings of the H200)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from opsctl.collectors import ledger
from opsctl.collectors.processes import (
    ProcInfo,
    process_roles,
    snapshot_tree,
    stopped_members,
    tree_order,
)
from opsctl.console.judge import ProcRole
from opsctl.console.judge_state import stopped_reason
from opsctl.domain import ranks
from opsctl.domain.gpu import device_dict, endpoint_gpus, host_from_raw
from tests.waiting import wait_until

API = "/work/main/.venv/bin/python -m vllm.entrypoints.openai.api_server --model m"
# the ledger records of a DP=2 server (pid, ppid, kind, title) as vLLM 0.32 left them
DP_RECORDS = [
    {"pid": 19068, "ppid": 18757, "role": "api_server", "title": API, "time": 1.0},
    {"pid": 19216, "ppid": 19068, "role": "engine_core", "title": "VLLM::EngineCore_DP0"},
    {"pid": 19217, "ppid": 19068, "role": "engine_core", "title": "VLLM::EngineCore_DP1"},
    {"pid": 19338, "ppid": 19216, "role": "worker", "title": "VLLM::Worker"},
    {"pid": 19345, "ppid": 19217, "role": "worker", "title": "VLLM::Worker"},
    {"pid": 19400, "ppid": 19068, "role": "model_inspector", "title": "python registry.py"},
]


def test_ledger_records_name_each_rank_a_dp_worker_by_its_engine():
    assert ranks.record_roles(DP_RECORDS) == {
        19068: "APIServer", 19216: "EngineCore_DP0", 19217: "EngineCore_DP1",
        19338: "Worker_DP0", 19345: "Worker_DP1",
    }  # fmt: skip


def test_ledger_entries_carry_the_rank_in_rank_order():
    patch = {"name": "p", "status": "applied", "detail": "ok", "reason": "r", "target": "t"}
    records = [dict(r, patches=[patch]) for r in reversed(DP_RECORDS[:5])]
    got = [(e.pid, e.rank, e.role) for e in ledger.entries(records)]
    assert got == [
        (19068, "APIServer", "api_server"),
        (19216, "EngineCore_DP0", "engine_core"),
        (19338, "Worker_DP0", "worker"),
        (19217, "EngineCore_DP1", "engine_core"),
        (19345, "Worker_DP1", "worker"),
    ]
    assert ledger.entries([dict(DP_RECORDS[3], title="", pid=1, patches=[patch])])[0].who in (
        "worker", "Worker"
    )  # no title and no such process: the kind  # fmt: skip


def _proc(pid: int, ppid: int, role: str) -> ProcInfo:
    return ProcInfo(pid, ppid, "python", role, "", None, None, None, "sleeping")


def test_the_tree_is_in_rank_order_parents_before_children():
    procs = [
        _proc(1, 0, "APIServer"), _proc(9, 1, "resource tracker"), _proc(6, 1, "EngineCore_DP1"),
        _proc(7, 6, "Worker_DP1"), _proc(4, 1, "EngineCore_DP0"), _proc(3, 1, "DPCoordinator"),
        _proc(5, 4, "Worker_DP0"),
    ]  # fmt: skip
    assert [p.role for p in tree_order(procs, 1)] == [
        "APIServer", "DPCoordinator", "EngineCore_DP0", "Worker_DP0", "EngineCore_DP1",
        "Worker_DP1", "resource tracker",
    ]  # fmt: skip


TREE = textwrap.dedent(
    """
    import multiprocessing, sys, time
    import setproctitle

    def rank(title, kids):
        setproctitle.setproctitle(title)
        for k in kids:
            multiprocessing.get_context("fork").Process(target=rank, args=(k, ())).start()
        time.sleep(120)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("fork")
        ctx.Process(target=rank, args=("VLLM::EngineCore_DP1", ("VLLM::Worker",))).start()
        ctx.Process(target=rank, args=("VLLM::EngineCore_DP0", ("VLLM::Worker",))).start()
        ctx.Process(target=rank, args=("VLLM::DPCoordinator", ())).start()
        time.sleep(120)
    """
)


@pytest.fixture
def titled_tree(tmp_path):
    """A process tree titled as vLLM titles a DP=2 server's (no vLLM in it); the root's
    command line is a script's path (the titles in its source would name it otherwise)."""
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        wait_until(lambda: len(psutil.Process(proc.pid).children(recursive=True)) == 5, 60,
                   "the titled tree")  # fmt: skip
        yield proc.pid
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait(10)


def test_a_real_tree_is_named_and_ordered_by_rank(titled_tree):
    tree = wait_until(lambda: _titled(snapshot_tree(titled_tree)), 30, "titles set")
    order = ["APIServer", "DPCoordinator", "EngineCore_DP0", "Worker_DP0", "EngineCore_DP1",
             "Worker_DP1"]  # fmt: skip
    assert [p.role for p in tree.processes] == order
    # the console's process view and `status` (process_roles): the same, cheaper
    assert [p.role for p in process_roles(titled_tree)] == order
    assert [p.pid for p in process_roles(titled_tree)] == [p.pid for p in tree.processes]


def _titled(tree):
    return tree if sum(p.cmdline.startswith("VLLM::") for p in tree.processes) == 5 else None


def test_a_stopped_rank_is_named_by_its_rank(titled_tree):
    wait_until(lambda: _titled(snapshot_tree(titled_tree)), 30, "titles set")
    dp1 = next(p for p in snapshot_tree(titled_tree).processes if p.role == "EngineCore_DP1")
    os.kill(dp1.pid, signal.SIGSTOP)
    try:
        stopped = wait_until(lambda: stopped_members(titled_tree), 30, "the stop seen")
    finally:
        os.kill(dp1.pid, signal.SIGCONT)
    assert stopped == (ProcRole(dp1.pid, "EngineCore_DP1"),)
    assert stopped_reason(stopped, 200).startswith(f"EngineCore_DP1 (pid {dp1.pid}) stopped")


GPU = Path(__file__).resolve().parents[1] / "data" / "gpu" / "console" / "hold"


def test_gpu_memory_is_attributed_to_each_rank_process():
    """The three torch processes that held 1, 2 and 3 GiB on the H200 (recorded NVML),
    placed as the workers of a TP=2 engine and a DP engine's plain worker: each GPU
    process is named by its rank, in rank order."""
    host = host_from_raw(json.loads((GPU / "raw-held.json").read_text()))
    hold = json.loads((GPU / "hold.json").read_text())
    a, b, c = sorted(h["pid"] for h in hold["holders"])
    members = [
        ranks.Member(1, 0, "python -m vllm.entrypoints.openai.api_server", True),
        ranks.Member(2, 1, "VLLM::EngineCore_DP0"),
        ranks.Member(c, 2, "VLLM::Worker_DP0_TP0"),
        ranks.Member(b, 2, "VLLM::Worker_DP0_TP1"),
        ranks.Member(3, 1, "VLLM::EngineCore_DP1"),
        ranks.Member(a, 3, "VLLM::Worker"),
    ]
    roles = [ProcRole(pid, r.role) for pid, r in ranks.rank_ids(members).items() if r]
    (gpu,) = endpoint_gpus(host, roles)
    got = [(p["pid"], p["role"]) for p in device_dict(gpu)["processes"]]
    assert got == [(c, "Worker_DP0_TP0"), (b, "Worker_DP0_TP1"), (a, "Worker_DP1")]
    held = {h["pid"]: h["nvml_used_bytes"] for h in hold["holders"]}
    assert all(p.used_bytes == held[p.pid] for p in gpu.processes)
