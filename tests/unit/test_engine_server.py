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
