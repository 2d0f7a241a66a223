"""Run ``python -m opsctl`` as an operator does, for the end-to-end tests and benchmarks."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def opsctl_json(*args: str, timeout: float) -> dict:
    """``python -m opsctl ARGS`` that must exit 0: the JSON document it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "opsctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def read_event(proc: subprocess.Popen, timeout: float = 400) -> dict:
    """The next JSON event line of ``opsctl serve --json`` (fails if serve exits first)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line:
            return json.loads(line)
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    raise AssertionError("no event from serve")
