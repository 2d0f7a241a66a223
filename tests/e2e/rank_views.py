"""Shared checks of tests/e2e/test_rank_views_{tp2,dp2}_e2e.py: every serve-side view of a
real multi-rank server names each rank (issue 44, item 2), read-only on a pooled engine."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from opsctl.checks import bundle, patches
from opsctl.collectors import ledger
from opsctl.collectors.processes import snapshot_tree
from opsctl.console import discovery
from opsctl.domain.ranks import parse_title
from tests.conftest import OPSCTL


def rank_roles(roles) -> list[str]:
    """The vLLM rank roles of ``roles`` in their order (helpers left out)."""
    return [r for r in roles if parse_title(r) is not None]


def check_tree(pid: int, expected: list[str]) -> None:
    """The process tree: every rank named, in rank order, parents before children."""
    tree = snapshot_tree(pid)
    assert rank_roles(p.role for p in tree.processes) == expected, tree.processes


def in_ledger(expected: list[str]) -> list[str]:
    """The ranks with a ledger record: vLLM's DP coordinator loads no general plugin."""
    return [r for r in expected if r != "DPCoordinator"]


def check_ledger(run_dir: Path, expected: list[str]) -> None:
    """The patch ledger per rank: library entries, ``patches`` report, and its CLI table."""
    expected = in_ledger(expected)
    entries = ledger.entries(ledger.read_records(run_dir))
    ranked = list(dict.fromkeys(e.rank for e in entries if e.rank))
    assert ranked == expected, [(e.pid, e.role, e.rank) for e in entries]
    doc = patches.run(patches.Options(run_dir=run_dir)).to_dict()
    assert rank_roles(p["rank"] for p in doc["processes"]) == expected, doc["processes"]
    out = subprocess.run([*OPSCTL, "patches", "--run", str(run_dir)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for role in expected:
        assert f" {role} " in out.stdout, out.stdout


def check_bundle(run_dir: Path, expected: list[str], tmp: Path) -> None:
    """``runs bundle``'s processes by rank (live tree and ledger); no first death."""
    out = tmp / "b.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(run_dir), out=out, fetch=False)).to_dict()
    assert doc["first_death"] is None, doc["first_death"]
    with tarfile.open(out) as tar:
        procs = json.load(tar.extractfile(f"{run_dir.name}/collected/processes.json"))
        deaths = json.load(tar.extractfile(f"{run_dir.name}/collected/deaths.json"))
    assert rank_roles(p["role"] for p in procs["live"]) == expected, procs["live"]
    ledger_ranks = rank_roles(p["rank"] or "" for p in procs["ledger"])
    assert ledger_ranks == in_ledger(expected), procs["ledger"]
    assert deaths == {"first_death": None, "exits": []}, deaths


def check_console(url: str, api_pid: int, expected: list[str]) -> None:
    """``console --once --json``'s pids, and discovery of the server as a plain vLLM
    process (no run directory: as for a server opsctl did not start)."""
    # --no-discover: another test's server on this machine is no part of this verdict
    out = subprocess.run([*OPSCTL, "console", "--once", "--json", "--no-discover", url],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    (ep,) = json.loads(out.stdout)["endpoints"]
    assert rank_roles(p["role"] for p in ep["pids"]) == expected, ep["pids"]
    found = [t for t in discovery.discover_processes() if t.pid == api_pid]
    assert found and found[0].run_dir is None, found
    local = discovery.local_state(found[0], with_roles=True)
    assert local is not None and local.alive and local.first_death is None
    assert rank_roles(p.role for p in local.procs) == expected, local.procs
