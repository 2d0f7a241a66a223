"""`opsctl patches --against VERSION|WHEEL` through the real CLI process: the upgrade
preflight's exit codes and output on the real 0.33.0 and 0.34.0 wheels (cached by
fetch_wheel, as the library tests do), and its bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from opsctl.collectors.vllm_sources import fetch_wheel
from tests.conftest import OPSCTL

pytestmark = pytest.mark.wheels


def opsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args], capture_output=True, text=True, timeout=300)


def test_033_is_unverified_exit_0_with_a_warning():
    wheel = fetch_wheel("0.33.0")
    r = opsctl("patches", "--against", str(wheel), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.preflight/1" and doc["verdict"] == "unverified"
    kv = next(p for p in doc["patches"] if p["name"] == "kv_hybrid_recompute")
    assert kv["exists"] and kv["upstream"] is False  # PR 50388 is still not in 0.33
    assert "not verified on vLLM 0.33.0" in r.stderr


def test_034_v1_runner_gone_probes_use_v2_exit_0_and_a_plain_table():
    fetch_wheel("0.34.0")  # the version form: read from the cache fetch_wheel filled
    r = opsctl("patches", "--against", "0.34.0")
    assert r.returncode == 0, r.stderr  # unverified, nothing missing: exit 0, a warning
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert rows["batch_probe"][2] == "yes" and rows["batch_probe"][-1] == "changed", rows
    assert "GPUModelRunner._sample: gone; uses" in r.stdout
    assert "─" not in r.stdout  # piped: plain columns


@pytest.mark.parametrize("against", ["not-a-version", "/nonexistent/vllm-0.33.0.whl"])
def test_bad_input_is_one_line_exit_2(against):
    r = opsctl("patches", "--against", against, "--json")
    assert r.returncode == 2, (r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
