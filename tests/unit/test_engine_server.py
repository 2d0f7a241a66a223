"""EngineServer's process bookkeeping, with real (non-vLLM) child processes."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from opsctl.engine.server import EngineServer
from tests.waiting import wait_until


def test_a_reused_pid_is_never_treated_as_ours():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server = EngineServer.__new__(EngineServer)  # bookkeeping only: no engine
        server.known_pids, server.run_dir, server.stop_report = {}, None, None
        server._remember([child.pid])
        assert server.known_pids[child.pid] == psutil.Process(child.pid).create_time()
        assert [p.pid for p in server._living([child.pid])] == [child.pid]
        # the same pid with another start time: a different process that got our old pid
        server.known_pids[child.pid] -= 5.0
        assert server._living([child.pid]) == []
    finally:
        child.kill()
        child.wait()


def test_engine_lock_is_shared_within_a_process_and_held_against_others(tmp_path, monkeypatch):
    """Two engines of one process (a session holding two, the console starting two) used
    to wait for ever on their own flock; other processes must still queue."""
    from opsctl.engine import server as srv

    path = tmp_path / "engine.lock"
    monkeypatch.setenv("OPSCTL_ENGINE_LOCK", str(path))
    lock = srv._EngineLock()
    probe = (
        "import fcntl, sys; fh = open(sys.argv[1]); fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )

    def others_can_take_it() -> bool:
        r = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True)
        return r.returncode == 0

    first, second = lock.acquire(), lock.acquire()  # returns at once: no self-deadlock
    assert first is second and lock.count == 2
    assert not others_can_take_it()
    lock.release()
    assert not others_can_take_it()  # the other engine still runs
    lock.release()
    assert others_can_take_it()


# An owner that forks the API server and is SIGKILLed before the child's preexec_fn
# sets the parent-death signal: the window is widened here by having the child wait,
# inside preexec_fn, until its owner is gone, then run opsctl's real preexec_fn.
LATE_PDEATHSIG = """
import os, subprocess, sys, time
from opsctl.engine.server import _parent_death_signal
owner, marker, pidfile = os.getpid(), sys.argv[1], sys.argv[2]
real = _parent_death_signal(owner)
def preexec():
    with open(pidfile, "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    while os.getppid() == owner and time.monotonic() < deadline:
        time.sleep(0.01)
    real()
subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", marker],
                 preexec_fn=preexec)
"""


def test_a_server_whose_owner_dies_before_the_parent_death_signal_is_set_never_runs(tmp_path):
    """prctl(PR_SET_PDEATHSIG) only covers a death after the call: an owner SIGKILLed
    between fork and prctl left the API server running until the plugin's watchdog."""
    marker, pidfile = tmp_path / "ran", tmp_path / "pid"
    owner = subprocess.Popen([sys.executable, "-c", LATE_PDEATHSIG, str(marker), str(pidfile)])
    try:
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30, "the fork"))
        owner.kill()
        owner.wait(10)

        def exited() -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_until(exited, 30, f"the orphaned child {pid} to exit")
        assert not marker.exists(), "the child exec'd its command after its owner died"
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_parent_death_preexec_lets_a_child_of_a_live_owner_run(tmp_path):
    from opsctl.engine.server import _parent_death_signal

    marker = tmp_path / "ran"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", str(marker)],
        preexec_fn=_parent_death_signal(os.getpid()),
    )
    assert child.wait(60) == 0
    assert marker.exists()
