"""The first rank death read back from recorded run directories (opsctl.collectors.deaths),
as the console's discovery, ``runs bundle`` and ``opsctl patches`` read them after the fact.

tests/data/deaths/ holds two run directories that tests/e2e/test_rank_death_e2e.py left on
this machine (vLLM 0.32, CPU, tiny-llama under load; server.log, meta.json, the ledger and
exits.jsonl as written): ``tp2-sigkill-worker_tp1`` and ``dp2-sigkill-enginecore_dp1``.
Their processes are long gone (a pid reused since is told apart by its start time)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

from opsctl.checks import bundle, patches
from opsctl.collectors import deaths
from opsctl.console import discovery
from opsctl.console.judge import Target
from opsctl.console.judge_state import DEAD, decide

DATA = Path(__file__).resolve().parents[1] / "data" / "deaths"
CASES = {
    "tp2-sigkill-worker_tp1": (
        "Worker_TP1",
        {"EngineCore", "Worker_TP0", "APIServer"},
        ["APIServer", "EngineCore", "Worker_TP0", "Worker_TP1"],
    ),
    "dp2-sigkill-enginecore_dp1": (
        "EngineCore_DP1",
        {"EngineCore_DP0", "Worker_DP0", "Worker_DP1", "DPCoordinator", "APIServer"},
        ["APIServer", "EngineCore_DP0", "Worker_DP0", "EngineCore_DP1", "Worker_DP1"],
    ),
}


@pytest.fixture(params=sorted(CASES))
def run(request, tmp_path) -> tuple[Path, str, set[str], list[str]]:
    """A copy of one recorded run directory under a runs directory of this test."""
    dest = tmp_path / "runs" / request.param
    shutil.copytree(DATA / request.param, dest)
    return (dest, *CASES[request.param])


def test_the_killed_rank_is_named_first_from_the_files(run):
    path, victim, others, _ = run
    d = deaths.of_run(path)
    assert d is not None and d.role == victim and d.signal == "SIGKILL" and d.exitcode == -9
    assert d.seen_by == "parent" and d.last_lines and not d.server_up
    fates = {f.role: f for f in d.others}
    assert others <= set(fates) and all(fates[r].fate != "alive" for r in others), fates
    assert fates["APIServer"].exitcode == 0  # vLLM's API server exits 0 after a rank's death
    meta = json.loads((path / "meta.json").read_text())
    assert meta["api_exit"]["exitcode"] == 0 and meta["seen_gone"]  # what serve noted


def test_the_consoles_dead_reason_names_it(run):
    path, victim, _, _ = run
    meta = json.loads((path / "meta.json").read_text())
    target = Target("run", meta["url"], "opsctl-run", pid=meta["pid"], run_dir=str(path),
                    pid_started=meta["pids"][str(meta["pid"])])  # fmt: skip
    local = discovery.local_state(target)
    assert local is not None and not local.alive
    assert local.first_death is not None and local.first_death.startswith(f"{victim} (pid ")
    assert local.death_lines[0] == local.first_death
    state, reason = decide(None, local, None, False)
    assert state == DEAD and reason.startswith(f"process {meta['pid']} exited: {victim} (pid ")


def test_the_bundle_holds_the_first_death_and_the_processes_by_rank(run, tmp_path):
    path, victim, _, ranks_in_order = run
    out = tmp_path / "b.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(path), out=out, fetch=False)).to_dict()
    assert doc["first_death"].startswith(f"{victim} (pid ") and "SIGKILL" in doc["first_death"]
    with tarfile.open(out) as tar:
        got = json.load(tar.extractfile(f"{path.name}/collected/deaths.json"))
        procs = json.load(tar.extractfile(f"{path.name}/collected/processes.json"))
    assert got["first_death"]["role"] == victim and got["exits"], got
    assert procs["live"] == []  # nothing of the run lives
    assert [p["rank"] for p in procs["ledger"]] == ranks_in_order


def test_patches_lists_the_ledger_per_rank(run):
    path, _, _, ranks_in_order = run
    doc = patches.run(patches.Options(run_dir=path)).to_dict()
    assert [p["rank"] for p in doc["processes"]] == ranks_in_order


def test_a_run_opsctl_stopped_has_no_first_death(tmp_path):
    """Every end recorded after opsctl began its stop is the stop's doing."""
    path = tmp_path / "run"
    shutil.copytree(DATA / "tp2-sigkill-worker_tp1", path)
    meta = json.loads((path / "meta.json").read_text())
    first = min(
        json.loads(line)["time"] for line in (path / "exits.jsonl").read_text().splitlines()
    )
    meta.update(stopped_at=first - 1.0, stop={"seconds": 0.5}, seen_gone={}, api_exit=None)
    (path / "meta.json").write_text(json.dumps(meta))
    assert deaths.of_run(path) is None
    assert discovery.first_death(str(path), alive=False) is None


def test_status_can_find_the_first_death_by_url(run):
    """``deaths.of_url``: what ``opsctl status URL`` would read for a local server opsctl
    started (the newest run at that URL, recent or still running); an old run is no news."""
    import os

    path, victim, _, _ = run
    url = json.loads((path / "meta.json").read_text())["url"]
    os.utime(path / "meta.json")  # a run that ended a moment ago
    found = deaths.of_url(url, root=path.parent)
    assert found is not None and found.role == victim
    assert deaths.of_url("http://127.0.0.1:1", root=path.parent) is None
    old = (path / "meta.json").stat().st_mtime - 7200
    os.utime(path / "meta.json", (old, old))
    assert deaths.of_url(url, root=path.parent, within_s=3600) is None
