"""EngineServer's process bookkeeping, with real (non-vLLM) child processes."""

from __future__ import annotations

import subprocess
import sys

import psutil

from opsctl.engine.server import EngineServer


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
