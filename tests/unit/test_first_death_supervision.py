"""opsctl's supervision names the rank that died first, on a real process tree (no vLLM):
a stand-in API server (a real child of EngineServer) starts the plugin's exit watcher and
an 'EngineCore' titled as vLLM titles it, which starts two 'workers'
(``VLLM::Worker_TP0``/``TP1``, their own ledger records as the plugin writes them, their
lines in server.log with vLLM's ``(ROLE pid=N)`` prefix). SIGKILL of Worker_TP1 then
plays vLLM's measured teardown: its EngineCore stops the other worker and exits, the API
server exits with code 0. EngineServer's tracking, ``supervise.died_error``, serve's
``process_list`` and the dashboard's collector must name Worker_TP1 first, with SIGKILL.
(tests/e2e/test_rank_hang_e2e.py and test_dp_stall_e2e.py do the same on real vLLM TP=2 and
DP=2 servers, at their end.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from opsctl.collectors.processes import snapshot_tree
from opsctl.engine import supervise
from opsctl.engine.model import ResolvedModel
from opsctl.engine.server import EngineServer, LaunchOptions
from opsctl.serve.collect import ServeCollector
from tests.standins.vllm_server import StandInFleet
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]

TREE = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys, time
    import setproctitle
    from engine_patches import exits

    RUN = os.environ["OPSCTL_RUN_DIR"]

    def ledger(kind):
        os.makedirs(os.path.join(RUN, "ledger"), exist_ok=True)
        rec = {"pid": os.getpid(), "ppid": os.getppid(), "role": kind,
               "title": setproctitle.getproctitle(), "time": time.time(), "patches": []}
        with open(os.path.join(RUN, "ledger", f"{os.getpid()}.json"), "w") as fh:
            json.dump(rec, fh)

    def watched(procs):  # the exit watcher has seen these children (its first look)
        deadline = time.monotonic() + 60
        while not {p.pid for p in procs} <= set(exits._KNOWN):
            assert time.monotonic() < deadline, "the exit watcher never saw its children"
            time.sleep(0.02)

    def say(role, text):
        print(f"({role} pid={os.getpid()}) INFO 12-06 10:59:07 [x.py:1] {text}", flush=True)

    def worker(rank):
        setproctitle.setproctitle(f"VLLM::Worker_TP{rank}")
        ledger("worker")
        say(f"Worker_TP{rank}", f"worker {rank} loaded the model")
        time.sleep(300)

    def engine_core():
        setproctitle.setproctitle("VLLM::EngineCore")
        ledger("engine_core")
        exits.start(RUN)
        ctx = mp.get_context("spawn")
        ws = [ctx.Process(target=worker, args=(r,), name=f"VllmWorker-{r}") for r in (0, 1)]
        for w in ws:
            w.start()
        watched(ws)
        say("EngineCore", "watching")
        mp.connection.wait([ws[1].sentinel])  # Worker_TP1 died: stop the other, exit
        say("EngineCore", "Worker proc VllmWorker-1 died unexpectedly")
        ws[0].terminate(); ws[0].join()
        sys.exit(1)

    if __name__ == "__main__":
        ledger("api_server")
        exits.start(RUN)
        core = mp.get_context("spawn").Process(target=engine_core, name="EngineCore")
        core.start()
        watched([core])
        say("APIServer", "watching")
        core.join()
        say("APIServer", "EngineDeadError: EngineCore encountered an issue")
        sys.exit(0)
    """
)


@pytest.fixture
def tree_server(tmp_path):
    """An EngineServer whose API server is the stand-in tree above (no HTTP)."""
    script = tmp_path / "api_server.py"
    script.write_text(TREE)
    run = tmp_path / "run"
    run.mkdir()
    log = (run / "server.log").open("ab")
    model = ResolvedModel("tiny-llama", tmp_path, "decoder", True, {})
    server = EngineServer(LaunchOptions(model=model, host="127.0.0.1", run_dir=run))
    server.run_dir, server.started_at = run, time.time()
    env = {**os.environ, "OPSCTL_RUN_DIR": str(run), "PYTHONPATH": str(REPO)}
    server.proc = subprocess.Popen([sys.executable, str(script)], stdout=log, stderr=log, env=env)
    try:
        yield server
    finally:
        server.stop(grace=5)
        log.close()


def _ranks_up(server: EngineServer):
    """The ranks' pids once all run and the EngineCore's exit watcher has seen its workers
    (a child that ends before the watcher's first look is not recorded: vLLM's ranks live
    far longer than that)."""
    server.track()
    roles = {p.role: p.pid for p in snapshot_tree(server.pid).processes}
    if not {"EngineCore", "Worker_TP0", "Worker_TP1"} <= set(roles):
        return None
    return (
        roles
        if "(EngineCore pid=" in server.log_text() and "watching" in server.log_text()
        else None
    )


def test_supervision_names_the_killed_worker_first(tree_server):
    server = tree_server
    roles = wait_until(lambda: _ranks_up(server), 60, "the stand-in ranks")
    listed = supervise.process_list(snapshot_tree(server.pid))
    # in rank order, helpers (the resource tracker) last
    assert [p["role"] for p in listed][:4] == [
        "APIServer",
        "EngineCore",
        "Worker_TP0",
        "Worker_TP1",
    ]
    assert listed[3]["title"] == "VLLM::Worker_TP1" and listed[3]["ppid"] == roles["EngineCore"]
    os.kill(roles["Worker_TP1"], signal.SIGKILL)
    wait_until(lambda: server.track() or server.exited() is not None, 60, "the teardown")
    err = supervise.died_error(server)
    assert err.message.startswith(
        f"engine died: Worker_TP1 (pid {roles['Worker_TP1']}) died first: killed by SIGKILL "
        "(exit code -9: an out-of-memory kill or kill -9); then "
    ), err.message
    assert "last lines of Worker_TP1: INFO 12-06 10:59:07 [x.py:1] worker 1 loaded" in err.message
    death = supervise.first_death(server)
    fates = {f.role: f for f in death.others}
    assert fates["EngineCore"].exitcode == 1 and fates["Worker_TP0"].exitcode == -15
    assert fates["APIServer"].fate == "exited" and fates["APIServer"].exitcode == 0
    assert not psutil.pid_exists(roles["Worker_TP0"]) or (
        psutil.Process(roles["Worker_TP0"]).status() == psutil.STATUS_ZOMBIE
    )


def test_a_stop_opsctl_asked_for_is_no_death(tree_server):
    server = tree_server
    wait_until(lambda: _ranks_up(server), 60, "the stand-in ranks")
    server.stop(grace=5)
    assert supervise.first_death(server) is None


def test_the_dashboard_shows_the_first_death_while_the_server_still_answers(tree_server):
    server = tree_server
    with StandInFleet(["healthy"]) as fleet:
        server.port = fleet.endpoints[0].port
        roles = wait_until(lambda: _ranks_up(server), 60, "the stand-in ranks")
        collector = ServeCollector(server)
        try:
            assert collector.collect().first_death == ()
            os.kill(roles["Worker_TP1"], signal.SIGKILL)
            snap = wait_until(lambda: _with_death(collector), 60, "the first death shown")
            assert snap.first_death[0].startswith(
                f"Worker_TP1 (pid {roles['Worker_TP1']}) died first: killed by SIGKILL"
            )
        finally:
            collector.close()


def _with_death(collector: ServeCollector):
    snap = collector.collect()
    return snap if snap.first_death else None


HALF_ALIVE = textwrap.dedent(
    """
    import multiprocessing as mp, os, sys, time
    import setproctitle
    from engine_patches import exits

    def coordinator():
        setproctitle.setproctitle("VLLM::DPCoordinator")
        time.sleep(300)

    if __name__ == "__main__":
        exits.start(os.environ["OPSCTL_RUN_DIR"])
        c = mp.get_context("spawn").Process(target=coordinator, name="VLLM_DP_Coordinator")
        c.start()
        while c.pid not in exits._KNOWN:
            time.sleep(0.02)
        print(f"(APIServer pid={os.getpid()}) INFO 12-06 10:59:07 [x.py:1] watching", flush=True)
        time.sleep(300)  # like vLLM after its coordinator's death: the server stays up
    """
)


def test_serve_says_a_rank_died_while_the_server_stays_up_and_stops_with_it(tmp_path, monkeypatch):
    """serve's own loop (supervise.serve, no dashboard) over a server whose coordinator is
    SIGKILLed while the API server stays up, as vLLM 0.32 does: a ``rank_died`` event at
    once, and the ``stopped`` event after Ctrl-C still names it, with the others alive."""
    from opsctl.engine import server as srv

    script = tmp_path / "api_server.py"
    script.write_text(HALF_ALIVE)
    events: list[tuple[str, dict]] = []

    with StandInFleet(["healthy"]) as fleet:

        class HalfAlive(EngineServer):
            def start(self):
                self.port, self.run_dir = fleet.endpoints[0].port, tmp_path / "run"
                self.run_dir.mkdir()
                self.started_at = time.time()
                log = (self.run_dir / "server.log").open("ab")
                env = {**os.environ, "OPSCTL_RUN_DIR": str(self.run_dir), "PYTHONPATH": str(REPO)}
                self.proc = subprocess.Popen([sys.executable, str(script)], stdout=log,
                                             stderr=log, env=env)  # fmt: skip
                return self

        def on_event(name: str, fields: dict) -> None:
            events.append((name, fields))
            if name == "ready":
                server = wait_until(lambda: _coordinator(fields["pid"]), 60, "the coordinator")
                wait_until(lambda: "watching" in (tmp_path / "run" / "server.log").read_text(),
                           60, "the watcher's first look")  # fmt: skip
                os.kill(server, signal.SIGKILL)
            if name == "rank_died":
                raise KeyboardInterrupt  # the operator's Ctrl-C

        monkeypatch.setattr(srv, "EngineServer", HalfAlive)
        req = supervise.ServeRequest("tiny-llama", timeout=60)
        assert supervise.serve(req, on_event) == 0
    names = [n for n, _ in events]
    assert names == ["starting", "ready", "rank_died", "stopped"], names
    told, stopped = events[2][1], events[3][1]
    assert told["role"] == "DPCoordinator" and told["signal"] == "SIGKILL"
    assert told["server_up"] is True and told["serving"] is True  # /health 200 (stand-in)
    assert [(f["role"], f["fate"]) for f in told["others"]] == [("APIServer", "alive")]
    death = stopped["first_death"]
    assert death["role"] == "DPCoordinator" and death["server_up"] is True
    assert stopped["leftover_pids"] == []


def _coordinator(api_pid: int) -> int | None:
    tree = snapshot_tree(api_pid)
    return next((p.pid for p in tree.processes if p.role == "DPCoordinator"), None)
