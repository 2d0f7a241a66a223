"""The rank that died first (issue 44, item 5), on real TP=2 and DP=2 vLLM servers.

Each test starts its own server with `opsctl serve --json` (the kill destroys it), puts
it under load, SIGKILLs one rank and waits for what vLLM 0.32 does (measured: it tears
the server down; the API server exits with code 0, 0.9-10 s after a TP worker's kill,
5-8 s after a DP EngineCore's). Then serve's events, its error line, the console's dead reason
(the console's own discovery code over the run) and the run's bundle must name the
killed rank first, with SIGKILL, and say what the other ranks did; nothing is left
running and no /dev/shm segment the tree held stays.

On main before this change serve said only `engine died (exit code 0): INFO: ... 500
Internal Server Error` and its stopped event had no ``first_death``.
"""

from __future__ import annotations

import json
import os
import signal
import tarfile
import threading
from pathlib import Path

import httpx
import jsonschema
import pytest

from opsctl.checks import bundle
from opsctl.console import discovery
from opsctl.domain.console import Target
from opsctl.domain.console_state import DEAD, decide
from opsctl.engine.server import free_port
from tests.e2e.test_serve_e2e import gone, json_documents, read_event, served
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

SCHEMA = Path(__file__).parents[1] / "data" / "schemas" / "opsctl.serve-3.schema.json"
OOM = "an out-of-memory kill or kill -9"


def serve_ranks(flag: str):
    """`opsctl serve --json` of tiny-llama (dummy weights, eager) with ``flag`` 2
    (``--tp``/``--dp``: opsctl derives the CPU binding of the ranks)."""
    args = ("tiny-llama", "--load-format", "dummy", "--eager", "--port", str(free_port()))
    return served(*args, flag, "2")


class Load:
    """Requests kept in flight (8 at a time) until stopped; DP: spread over both engines
    with vLLM's ``X-data-parallel-rank`` header. Counts, per rank, the requests answered
    200 and those sent and not answered yet."""

    def __init__(self, url: str, dp: bool) -> None:
        self.url, self.dp = url, dp
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = [0, 0]
        self.inflight = [0, 0]
        self.codes: list[object] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(8)]

    def _run(self, i: int) -> None:
        rank = i % 2 if self.dp else 0
        headers = {"X-data-parallel-rank": str(rank)} if self.dp else {}
        body = {"model": "tiny-llama", "prompt": "hello " * 5, "max_tokens": 200,
                "ignore_eos": True}  # fmt: skip
        while not self.stop.is_set():
            with self.lock:
                self.inflight[rank] += 1
            try:
                r = httpx.post(f"{self.url}/v1/completions", json=body, headers=headers, timeout=60)
                code: object = r.status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            with self.lock:
                self.inflight[rank] -= 1
                self.ok[rank] += code == 200
                self.codes.append(code)
            if code != 200:
                self.stop.wait(0.2)

    def busy(self, ranks: int) -> bool:
        """Every rank answered a request and has others in flight."""
        with self.lock:
            return all(self.ok[r] >= 1 and self.inflight[r] >= 1 for r in range(ranks))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def kill_under_load(flag: str, victim: str):
    """Serve, load, SIGKILL ``victim``; (ready, events, stderr, rc, role pids, shm left)."""
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    dp = flag == "--dp"
    with serve_ranks(flag) as proc:
        ready = read_event(proc)
        validator.validate(ready)
        roles = {p["role"]: p["pid"] for p in ready["pids"]}
        assert victim in roles, ready["pids"]
        with Load(ready["url"], dp=dp) as load:
            wait_until(lambda: load.busy(2 if dp else 1), 180, "requests served and in flight",
                       lambda: (load.ok, load.inflight, load.codes[-5:]))  # fmt: skip
            os.kill(roles[victim], signal.SIGKILL)
            rc = proc.wait(120)
        out, err = proc.stdout.read(), proc.stderr.read()
        left = proc.shm.left()
    events = [ready] + [d for d in json_documents(out) if d.get("schema") == "opsctl.serve/3"]
    for doc in events:
        validator.validate(doc)
    return ready, events, err, rc, roles, left


def check_first_death(death: dict, victim: str, pid: int, others: set[str]) -> None:
    """``death`` names ``victim`` first, killed by SIGKILL, and what each other rank did."""
    assert death["role"] == victim and death["pid"] == pid, death
    assert death["exitcode"] == -9 and death["signal"] == "SIGKILL", death
    assert OOM in death["cause"] and death["seen_by"] == "parent", death
    assert death["last_lines"], "the killed rank's last log lines"
    fates = {f["role"]: f for f in death["others"]}
    assert others <= set(fates), (others, fates)  # what every other rank did is said
    for role in others:
        # a worker of the dead engine may outlive the API server a moment (seen: DP)
        assert fates[role]["fate"] in ("exited", "gone", "alive"), fates[role]
    assert fates["APIServer"]["fate"] == "exited" and fates["APIServer"]["exitcode"] == 0
    assert fates["APIServer"]["after_s"] >= 0
    assert death["summary"].startswith(f"{victim} (pid {pid}) died first: killed by SIGKILL")


def check_views_of_the_dead_run(
    run_dir: Path, api_pid: int, victim: str, tmp: Path, url: str
) -> None:
    """The console's dead reason, `opsctl status` and the run's bundle name the first death."""
    from opsctl.checks import status
    from opsctl.checks.target import UrlTarget

    said = status.run(UrlTarget(url), status.Options(timeout=2.0, canary_timeout=None)).to_dict()
    assert said["state"] == "unreachable" and said["first_death"]["role"] == victim, said
    assert said["reason"].startswith(f"{victim} (pid "), said["reason"]
    target = Target("run", "http://127.0.0.1:1", "opsctl-run", pid=api_pid, run_dir=str(run_dir))
    local = discovery.local_state(target)
    assert local is not None and not local.alive
    assert local.first_death and local.first_death.startswith(f"{victim} (pid "), local
    state, reason = decide(None, local, None, False)
    assert state == DEAD and f"{victim} (pid " in reason and "SIGKILL" in reason, reason
    out = tmp / "b.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(run_dir), out=out, fetch=False)).to_dict()
    assert doc["first_death"].startswith(f"{victim} (pid "), doc["first_death"]
    with tarfile.open(out) as tar:
        deaths = json.load(tar.extractfile(f"{run_dir.name}/collected/deaths.json"))
        procs = json.load(tar.extractfile(f"{run_dir.name}/collected/processes.json"))
    assert deaths["first_death"]["role"] == victim and deaths["exits"], deaths
    assert victim in {p["rank"] for p in procs["ledger"]}, procs


def test_sigkill_of_worker_tp1_under_load_is_named_first(tmp_path):
    ready, events, err, rc, roles, left = kill_under_load("--tp", "Worker_TP1")
    assert {"APIServer", "EngineCore", "Worker_TP0", "Worker_TP1"} <= set(roles), roles
    assert rc == 1, err
    kinds = [e["event"] for e in events]
    assert kinds[0] == "ready" and kinds[-1] == "stopped", kinds
    # vLLM takes 0.9-10 s to tear the server down (measured): serve may say who died
    # before the API server's exit ("rank_died"), once
    told = [e for e in events if e["event"] == "rank_died"]
    assert len(told) <= 1 and all(e["role"] == "Worker_TP1" and e["server_up"] for e in told)
    stopped = events[-1]
    check_first_death(stopped["first_death"], "Worker_TP1", roles["Worker_TP1"],
                      {"EngineCore", "Worker_TP0", "APIServer"})  # fmt: skip
    core = {f["role"]: f for f in stopped["first_death"]["others"]}["EngineCore"]
    assert core["fate"] in ("exited", "gone"), core  # the EngineCore died with its worker
    assert f"engine died: Worker_TP1 (pid {roles['Worker_TP1']}) died first: killed by " \
           "SIGKILL" in err, err  # fmt: skip
    assert stopped["leftover_pids"] == [] and gone(roles.values()), roles
    assert left == set(), left  # no /dev/shm segment the tree held (TP's cpushm) stays
    check_views_of_the_dead_run(
        Path(ready["run_dir"]), ready["pid"], "Worker_TP1", tmp_path, ready["url"]
    )


def test_sigkill_of_engine_core_dp1_under_load_is_named_first(tmp_path):
    ready, events, err, rc, roles, left = kill_under_load("--dp", "EngineCore_DP1")
    assert {"APIServer", "DPCoordinator", "EngineCore_DP0", "EngineCore_DP1", "Worker_DP0",
            "Worker_DP1"} <= set(roles), roles  # fmt: skip
    assert rc == 1, err
    assert [e["event"] for e in events][-1] == "stopped", events
    stopped = events[-1]
    check_first_death(stopped["first_death"], "EngineCore_DP1", roles["EngineCore_DP1"],
                      {"EngineCore_DP0", "Worker_DP0", "Worker_DP1", "DPCoordinator",
                       "APIServer"})  # fmt: skip
    assert "engine died: EngineCore_DP1 (pid" in err and "SIGKILL" in err, err
    dp0 = {f["role"]: f for f in stopped["first_death"]["others"]}["EngineCore_DP0"]
    assert dp0["fate"] in ("exited", "gone"), dp0  # the API server stopped the other engine
    assert all(e["role"] == "EngineCore_DP1" for e in events if e["event"] == "rank_died")
    assert stopped["leftover_pids"] == [] and gone(roles.values()), roles
    assert left == set(), left
    check_views_of_the_dead_run(
        Path(ready["run_dir"]), ready["pid"], "EngineCore_DP1", tmp_path, ready["url"]
    )
