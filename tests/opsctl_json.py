"""Run ``python -m opsctl`` as an operator does, for the end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys


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
