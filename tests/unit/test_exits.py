"""engine_patches.exits and the ledger's titles, on real processes (no vLLM).

The exit watcher records a multiprocessing child's end (pid, name, exit code: -9 for
SIGKILL) the moment it ends, from its parent; the ledger record is written again with
the title vLLM gives the process later (``setproctitle``), which is where opsctl reads a
process's rank from."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from engine_patches import exits
from tests.waiting import wait_until


def _sleep() -> None:
    time.sleep(60)


def test_a_killed_child_is_recorded_with_its_signal_and_name(tmp_path):
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_sleep, name="VllmWorker-1", daemon=True)
    child.start()
    known: dict = {}
    try:
        exits.watch_once(known, str(tmp_path), 0.05)  # it runs: nothing recorded
        assert child.pid in known and not (tmp_path / exits.FILE).exists()
        os.kill(child.pid, signal.SIGKILL)
        t0 = time.time()
        wait_until(lambda: exits.watch_once(known, str(tmp_path), 1.0) or not known, 30,
                   "the watcher to see the child end")  # fmt: skip
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
    (rec,) = [json.loads(line) for line in (tmp_path / exits.FILE).read_text().splitlines()]
    assert rec["pid"] == child.pid and rec["name"] == "VllmWorker-1"
    assert rec["exitcode"] == -9 and rec["parent"] == os.getpid()
    assert abs(rec["time"] - t0) < 30


SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from engine_patches import exits

    def until(cond, what):
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    def stay():
        time.sleep(60)

    if __name__ == "__main__":
        run = sys.argv[1]
        assert exits.start(run)
        ctx = multiprocessing.get_context("spawn")
        a = ctx.Process(target=stay, name="EngineCore_DP1", daemon=True)
        b = ctx.Process(target=stay, name="EngineCore_DP0", daemon=True)
        a.start(); b.start()
        until(lambda: {a.pid, b.pid} <= set(exits._KNOWN), "the watcher to see both")
        os.kill(a.pid, signal.SIGKILL)
        path = os.path.join(run, exits.FILE)
        until(lambda: os.path.exists(path) and str(a.pid) in open(path).read(), "a's record")
        b.terminate(); b.join()  # b's end: recorded by the exit-time round at the latest
    """
)


def test_the_watcher_thread_and_its_exit_round_record_every_child(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=120,
                   env=env)  # fmt: skip
    recs = {r["name"]: r for r in map(json.loads, (tmp_path / exits.FILE).read_text().splitlines())}
    assert recs["EngineCore_DP1"]["exitcode"] == -9
    assert recs["EngineCore_DP0"]["exitcode"] == -15  # recorded at the parent's exit


def test_no_watcher_without_a_run_directory(monkeypatch):
    monkeypatch.delenv("OPSCTL_RUN_DIR", raising=False)
    assert exits.start() is False


TITLE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import setproctitle
    from engine_patches import registry
    registry.patches = lambda: []
    registry.platform_info = lambda: ("cpu", None)
    registry.vllm_version = lambda: "0.32.0"
    rec = registry.apply_all()
    first = rec["title"]
    setproctitle.setproctitle("VLLM::Worker_TP1")  # what vLLM's set_process_title does
    print(json.dumps({"first": first, "pid": rec["pid"]}))
    """
)


def test_the_ledger_is_written_again_with_the_title_vllm_sets_later(tmp_path):
    env = {**os.environ, "OPSCTL_RUN_DIR": str(tmp_path),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", TITLE_SCRIPT], capture_output=True, text=True,
                         check=True, timeout=120, env=env)  # fmt: skip
    seen = json.loads(out.stdout.splitlines()[-1])
    assert not seen["first"].startswith("VLLM::")  # at the plugin's load: python's argv
    ledger = json.loads((tmp_path / "ledger" / f"{seen['pid']}.json").read_text())
    assert ledger["title"] == "VLLM::Worker_TP1" and ledger["titled_at"] >= ledger["time"]
