"""A planted in-engine hang (issue 35): the EngineCore's step blocks on a lock (test knob
OPSCTL_HANG_STEP) while the API server answers /health 200 and the gauges stay where the
last step left them. No process is stopped, so only a request can tell: `status` and
`console --once` send the canary, which does not return, and say stalled; `opsctl
stacks` names the blocking frame (planted_hang) in the EngineCore, without stopping it,
and says stuck (exit 1).
Released, the engine answers the queued requests and everything says ready again.

Engine starts: 1 (its own: the knob alters the engine)."""

from __future__ import annotations

import json
import subprocess
import threading

import httpx
import pytest

from tests.conftest import OPSCTL, running_engine
from tests.waiting import wait_until

pytestmark = pytest.mark.engine


def opsctl(*args: str) -> tuple[int, dict]:
    r = subprocess.run([*OPSCTL, *args, "--json"], capture_output=True, text=True, timeout=180)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    from engine_patches import knobs

    trigger = tmp_path_factory.mktemp("hang") / "hold"
    with running_engine(
        "tiny-llama", load_format="dummy", knobs={knobs.HANG_STEP: str(trigger)}
    ) as server:
        yield server, trigger
        trigger.unlink(missing_ok=True)


def test_a_hung_step_is_stalled_by_the_canary_and_stacks_name_the_frame(hung):
    server, trigger = hung
    url = server.url
    code, doc = opsctl("status", url)
    assert code == 0 and doc["state"] == "ready" and doc["canary"]["ok"] is True, doc
    trigger.touch()
    answers: list[int] = []

    def ask() -> None:  # a client whose request the hung engine holds
        body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        answers.append(r.status_code)

    client = threading.Thread(target=ask, daemon=True)
    client.start()
    try:
        code, doc = opsctl("status", url, "--canary-timeout", "3s")
        assert code == 1 and doc["state"] == "stalled", doc
        assert doc["health_status"] == 200 and doc["stopped_processes"] == []
        assert doc["canary"]["ok"] is False and doc["reason"].startswith("canary:")
        code, gate = opsctl("console", "--once", "--no-discover", "--canary-timeout", "3s", url)
        (e,) = gate["endpoints"]
        assert code == 1 and e["state"] == "stalled" and e["reason"].startswith("canary:"), e
        code, st = opsctl("stacks", url)
        assert code == 1 and st["verdict"] == "stuck", st  # what the stacks show: not a pass
        (core,) = [p for p in st["processes"] if p["role"] == "EngineCore"]
        assert core["source"] == "signal" and "planted_hang" in core["verdict"], core
        assert [(c["role"], c["status"]) for c in st["culprits"]] == [("EngineCore", "stuck")]
        assert st["headline"].startswith(f"EngineCore (pid {core['pid']}) stuck: in planted_hang")
        assert httpx.get(f"{url}/health", timeout=15).status_code == 200
        assert answers == []  # still held
    finally:
        trigger.unlink(missing_ok=True)
    client.join(120)
    assert answers == [200]
    wait_until(lambda: opsctl("status", url)[1]["state"] == "ready", 120, "ready again")
