"""``opsctl console --once --json --log URL=FILE`` in a subprocess, no engine: a server
that died (nothing answers on its port) with its real vLLM 0.32 death log shows the
decisive lines in its row's reason and in ``log``; a stand-in vLLM with a real healthy
log shows its load phase; a missing log is a reason, not an error; a targets file's
``log`` key works like --log. (The live engine's own log: tests/e2e/test_tee_e2e.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from opsctl.engine.server import free_port
from tests.standins.vllm_server import StandInFleet

DATA = Path(__file__).resolve().parents[1] / "data/serverlogs"
ARCH = "Model architectures ['NoSuchArchForCausalLM'] are not supported"


def console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "console", "--once", "--json", "--no-discover",
         "--interval", "0.3s", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_dead_server_log_explains_it_and_healthy_log_shows_its_phase(tmp_path):
    dead_log = tmp_path / "dead.log"
    shutil.copy(DATA / "vllm-0.32-no-such-arch-death.log", dead_log)
    ok_log = tmp_path / "ok.log"
    shutil.copy(DATA / "vllm-0.32-tiny-llama-healthy.log", ok_log)
    dead = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    with StandInFleet(["healthy"]) as fleet:
        (ok,) = fleet.urls
        r = console("--log", f"{dead}={dead_log}", "--log", f"{ok}={ok_log}")
    assert r.returncode == 1, r.stderr  # one failing endpoint
    doc = json.loads(r.stdout)
    by_url = {e["url"]: e for e in doc["endpoints"]}
    d, h = by_url[dead], by_url[ok]
    assert d["state"] == "unreachable" and ARCH in d["reason"]
    assert any(ARCH in line for line in d["log"]["decisive_lines"])
    assert d["log"]["path"] == str(dead_log) and d["log"]["reason"] is None
    assert h["state"] == "ready" and h["log"]["load_phase"] == "ready"
    assert h["log"]["decisive_lines"] == [] and h["reason"] is None
    assert "Traceback" not in r.stderr


def test_missing_log_is_a_reason_and_targets_file_log_key(tmp_path):
    with StandInFleet(["healthy"]) as fleet:
        (ok,) = fleet.urls
        tf = tmp_path / "targets.toml"
        tf.write_text(f'[[targets]]\nname = "n1"\nurl = "{ok}"\nlog = "later.log"\n')
        r = console("--targets", str(tf))
    assert r.returncode == 0, r.stderr
    (ep,) = json.loads(r.stdout)["endpoints"]
    assert ep["name"] == "n1" and ep["state"] == "ready"
    assert ep["log"]["reason"] == "log file not found"
    assert ep["log"]["path"] == str(tmp_path / "later.log")
