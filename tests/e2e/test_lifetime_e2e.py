"""The engine lifetime policy against the real engine: every way opsctl can be told to
stop (SIGHUP, a second SIGTERM during the stop, SIGTERM to a diag mid-start) leaves no
process and no /dev/shm segment, and SIGKILL of opsctl itself (no cleanup possible)
still takes the whole engine tree down within 15 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from opsctl.collectors import engine_tmp
from opsctl.engine.server import free_port
from tests.conftest import OPSCTL
from tests.e2e.test_serve_e2e import gone, left_in, served
from tests.opsctl_run import read_event
from tests.standins.shm_watch import TreeShm
from tests.waiting import wait_until

pytestmark = pytest.mark.engine


def tree(pid: int) -> list[int]:
    try:
        return [pid, *[c.pid for c in psutil.Process(pid).children(recursive=True)]]
    except psutil.NoSuchProcess:
        return []


def test_sighup_stops_serve_in_order(short_tmp):
    """Closing the terminal of a foreground `opsctl serve` (SIGHUP) used to orphan it.
    Also: vLLM's IPC sockets and rendezvous file (left in $TMPDIR by every engine, even
    after an orderly stop) go to the engine's private directory, removed at the stop."""
    tmp = short_tmp
    env = {**os.environ, "TMPDIR": str(tmp)}
    # the check engines' layout (the API server forks its EngineCore, which runs the
    # model): the SIGKILL test below has vLLM's own layout
    args = ("tiny-llama", "--load-format", "dummy", "--port", str(free_port()))
    with served(*args, "--eager", "--single-process", env=env) as proc:
        ready = read_event(proc)
        pids = tree(ready["pid"])
        assert ready["single_process"] is True and "Worker" not in {
            p["role"] for p in ready["pids"]
        }
        assert len(pids) >= 2  # the API server and the EngineCore it forked
        private = list(tmp.glob(engine_tmp.PREFIX + "*"))
        assert len(private) == 1, list(tmp.iterdir())
        sockets = [p for p in private[0].iterdir() if p.is_socket()]
        assert sockets, f"no vLLM IPC socket in {private[0]}: {list(private[0].iterdir())}"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(30) == 0, proc.stderr.read()
        stopped = read_event(proc, 5)
        assert stopped["event"] == "stopped" and stopped["leftover_pids"] == []
        assert time.monotonic() - t0 < 15
        assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
        assert proc.shm.left() == set()  # what its engine held is gone
        assert left_in(tmp) == []


def test_second_sigterm_during_stop_hurries_it_and_never_aborts_it():
    """vLLM's resource tracker is frozen (SIGSTOP; vLLM's own shutdown SIGKILLs EngineCore
    and Worker, frozen or not, but leaves the tracker to exit by itself), so the stop
    waits in its polite phase; a second SIGTERM then makes it SIGKILL at once. The
    stop completes: exit 0, nothing left, well before the 9 s polite phase would end."""
    args = ("tiny-llama", "--load-format", "dummy", "--eager", "--port", str(free_port()))
    with served(*args) as proc:
        ready = read_event(proc)
        pids = tree(ready["pid"])
        tracker = next(
            pid for pid in pids if "resource_tracker" in " ".join(psutil.Process(pid).cmdline())
        )
        os.kill(tracker, signal.SIGSTOP)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # the stop is under way once the API server got its SIGTERM and exited
        wait_until(lambda: gone([ready["pid"]]), 10, "the API server to exit")
        assert psutil.pid_exists(tracker)  # frozen: the stop is still waiting for it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
        elapsed = time.monotonic() - t0
        stopped = read_event(proc, 5)
        assert stopped["leftover_pids"] == [] and "SIGKILL" in stopped["signals"], stopped
        assert elapsed < 8, elapsed  # hurried: the polite phase alone lasts 9 s
        assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
        assert proc.shm.left() == set()


def test_sigterm_to_a_diag_mid_start_exits_130_and_leaves_nothing():
    """A diag that started its own engine used to die on SIGTERM without stopping it."""
    proc = subprocess.Popen(
        [*OPSCTL, "diag", "usage", "--model", "tiny-reranker", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watch = TreeShm(proc.pid).__enter__()  # its engine tree's segments, seen while it runs
    try:
        # wait until the engine's EngineCore exists (meta.json lists its processes)
        def engine_pids() -> list[int]:
            for meta in Path(os.environ["OPSCTL_HOME"], "runs").glob("*diag-usage*/meta.json"):
                with open(meta) as fh:
                    try:
                        doc = json.load(fh)
                    except ValueError:
                        continue
                if doc.get("owner_pid") == proc.pid and len(doc.get("pids", {})) >= 2:
                    return tree(doc["pid"])
            return []

        pids = wait_until(engine_pids, 300, "the diag's engine to start")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        stderr = proc.stderr.read()
        assert rc == 130, stderr
        assert "interrupted" in stderr
        assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
        watch.__exit__(None, None, None)
        assert watch.left() == set(), watch.left()  # what its engine held is gone
    finally:
        watch.__exit__(None, None, None)
        if proc.poll() is None:
            proc.kill()


def test_sigkill_of_opsctl_takes_the_engine_tree_down_within_15_s(short_tmp):
    """No cleanup can run in opsctl: the engine's own watchdog (plugin) must act. The
    API server also removes its private $TMPDIR (vLLM's sockets) on its way out."""
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    args = ("tiny-llama", "--load-format", "dummy", "--eager", "--port", str(free_port()))
    with served(*args, env=env) as proc:
        ready = read_event(proc)
        pids = tree(ready["pid"])
        assert len(pids) >= 3  # vLLM's layout: API server, EngineCore, Worker
        assert len(list(short_tmp.glob(engine_tmp.PREFIX + "*"))) == 1, left_in(short_tmp)
        t0 = time.monotonic()
        proc.kill()
        proc.wait(10)
        wait_until(lambda: gone(pids), 15, f"engine processes {pids} to exit")
        print(f"engine tree gone {time.monotonic() - t0:.1f} s after SIGKILL of opsctl")
        assert left_in(short_tmp) == []


def test_sigkill_of_opsctl_during_engine_start_takes_the_server_down():
    """Before the plugin runs (vLLM's imports take ~10 s) the parent-death signal acts."""
    env = {**os.environ, "OPSCTL_ENGINE_LOCK": ""}  # never loads a model: no lock needed
    proc = subprocess.Popen(
        [*OPSCTL, "serve", "--no-tui", "--json", "--eager", "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        api = wait_until(
            lambda: [c.pid for c in psutil.Process(proc.pid).children()], 60, "the API server"
        )
        pids = tree(api[0])
        t0 = time.monotonic()
        proc.kill()
        proc.wait(10)
        wait_until(lambda: gone(pids), 15, f"server processes {pids} to exit")
        print(f"server gone {time.monotonic() - t0:.1f} s after SIGKILL of opsctl")
    finally:
        if proc.poll() is None:
            proc.kill()


# Starts an engine from a worker thread: no parent-death signal then (it would fire when
# that thread ends), so only the plugin's owner watchdog can stop the orphan.
THREADED_OWNER = """
import sys, threading
from opsctl.engine.model import resolve
from opsctl.engine.server import EngineServer, LaunchOptions
def main():
    # a check engine's layout: the EngineCore is forked from the API server (its own
    # watchdog must start there too) and runs the model
    s = EngineServer(LaunchOptions(model=resolve("tiny-llama"), load_format="dummy",
                                   label="test-watchdog", single_process=True))
    s.start(); s.wait_healthy(400)
    print(s.pid, flush=True)
    threading.Event().wait()
if __name__ == "__main__":
    t = threading.Thread(target=main, daemon=True); t.start(); t.join()
"""


def test_owner_watchdog_stops_an_engine_whose_owner_died(short_tmp):
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADED_OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"owner exited {proc.poll()}"
        pids = tree(int(line))
        assert len(pids) >= 2  # the API server and the EngineCore it forked
        t0 = time.monotonic()
        proc.kill()
        proc.wait(10)
        wait_until(lambda: gone(pids), 15, f"engine processes {pids} to exit")
        print(f"watchdog: engine tree gone {time.monotonic() - t0:.1f} s after its owner died")
        assert left_in(short_tmp) == []  # the API server removed its private $TMPDIR
    finally:
        if proc.poll() is None:
            proc.kill()
