"""`opsctl runs list | clean` against a real orphaned vLLM engine.

The orphan is made the way an operator gets one: an opsctl process (here a small
Python script driving opsctl.engine.server.EngineServer, with the owner watchdog and
the parent-death signal switched off by the test-only knob) is SIGKILLed while its
engine runs. `runs list` must call the run orphaned, `runs clean --yes` must stop the
whole engine tree (checked with psutil, by pid and start time) and remove the psm_*
segments it held. The runs directory is a private OPSCTL_HOME, so other runs on this
machine are never touched."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from opsctl.collectors import engine_tmp, shm
from opsctl.suite.shutdown.collect import still_alive
from tests.conftest import OPSCTL
from tests.e2e.test_serve_e2e import left_in

pytestmark = pytest.mark.engine

CHILD = r"""
import json, sys
from pathlib import Path
from engine_patches import knobs
from opsctl.engine.model import resolve
from opsctl.engine.server import EngineServer, LaunchOptions

opts = LaunchOptions(
    model=resolve("tiny-llama"),
    load_format="dummy",
    label="orphan",
    single_process=False,  # vLLM's layout: its Worker's psm_* ring buffers are the point
    run_dir=Path(sys.argv[1]),
    knobs={knobs.NO_OWNER_WATCH: "1"},
)
server = EngineServer(opts)
server.start()
server.wait_healthy(400)
print(json.dumps({"pid": server.pid, "url": server.url}), flush=True)
sys.stdin.readline()  # hold the engine until SIGKILLed
"""


def opsctl(home, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPSCTL_HOME": str(home)}
    return subprocess.run(
        [*OPSCTL, "runs", *args], capture_output=True, text=True, env=env, timeout=120
    )


# pids still running the very process recorded (same start time), not zombies
ours = still_alive


def wait_for(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_runs_clean_reaps_a_real_orphaned_engine(tmp_path, short_tmp):
    home = tmp_path / "home"
    run_dir = home / "runs" / "20990101-000000-orphan-tiny-llama-0"
    run_dir.parent.mkdir(parents=True)
    tmp = short_tmp  # the owner's $TMPDIR: the engine's private one is made in it
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    engine: dict[int, float] = {}
    try:
        ready, _, _ = select.select([child.stdout], [], [], 600)
        line = child.stdout.readline() if ready else ""
        if not line:
            child.kill()
            raise AssertionError(f"engine did not start: {child.stderr.read()[-3000:]}")
        api_pid = json.loads(line)["pid"]
        api = psutil.Process(api_pid)
        engine = {p.pid: p.create_time() for p in [api, *api.children(recursive=True)]}
        assert len(engine) >= 2  # API server + EngineCore (+ worker, resource tracker)
        held = {
            os.path.basename(m.path)
            for m in shm.scan_holders(list(engine)).mappings
            if not m.deleted and os.path.basename(m.path).startswith("psm_")
        }
        assert held, "the engine holds no psm_* ring buffer"
        (private,) = tmp.glob(engine_tmp.PREFIX + "*")
        assert any(p.is_socket() for p in private.iterdir()), list(private.iterdir())

        child.send_signal(signal.SIGKILL)  # opsctl dies without any chance to clean up
        child.wait(30)
        assert ours(engine), "the engine died with its owner: no orphan to reap"

        r = opsctl(home, "list", "--json")
        assert r.returncode == 0, r.stderr
        (run,) = json.loads(r.stdout)["runs"]
        assert run["state"] == "orphaned", run
        assert run["owner_pid"] == child.pid and run["owner_alive"] is False
        assert api_pid in run["alive_pids"] and run["model"] == "tiny-llama"

        r = opsctl(home, "clean", "--json")  # dry run: nothing happens
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["runs"][0]["action"] == "reap" and ours(engine)

        t0 = time.time()
        r = opsctl(home, "clean", "--yes", "--json")
        took = time.time() - t0
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        (rep,) = doc["reaped"]
        assert api_pid in rep["pids"] and rep["leftover"] == []
        assert ours(engine) == [], f"engine processes left: {ours(engine)}"
        left = held & {f.name for f in shm.list_files()}
        assert not left, f"segments left: {left} (report: {rep})"
        assert left_in(tmp) == []  # the engine's private $TMPDIR went with it
        print(f"reap: {rep['duration_s']} s ({', '.join(rep['signals'])}), CLI {took:.1f} s")

        r = opsctl(home, "list", "--json")
        (run,) = json.loads(r.stdout)["runs"]
        assert run["state"] == "dead" and run["reaped_at"] and run["alive_pids"] == []
        assert run_dir.is_dir()  # reaped, kept for its log until a later clean prunes it
        r = opsctl(home, "clean", "--yes", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["pruned"] == [run_dir.name]
        assert not run_dir.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        for pid in ours(engine):  # never leave an engine behind, even on failure
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        wait_for(lambda: not ours(engine), 30, "leftover engine processes to exit")
