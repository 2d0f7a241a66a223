"""certify over a fleet against real servers: two real vLLM servers (tiny-llama, dummy
weights, single-process, both alive at once under one engine lock), a stand-in that
accepts and never answers, and a stand-in that wants an API key (tests/standins/fleet.py).

- the targets file (key from ``api_key_env``): engine A (isolated as invariance wants:
  prefix caching off), engine B (vLLM's defaults: prefix caching on, so invariance is
  not applicable to its configuration: skipped with the reason and the command that
  runs it) and the keyed stand-in pass; the hung one is a failed
  ``liveness`` case (no answer within the 30 s first contact); one JUnit file with a
  testsuite per target, one SARIF log with a run per target, the JSON verdicts and
  fingerprints; exit 1; the wall time is the slowest target's (the hung one), not the
  sum of the targets';
- URL arguments with a wrong ``--api-key``: the keyed stand-in fails liveness
  (unauthorized), the engines (which take no key) pass.

Engine starts: 2 (this module's own: the fleet needs two real servers alive at once,
which the one-engine session pool cannot give).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import two_engines
from tests.standins.fleet import KEY, hung_server, keyed_server

pytestmark = pytest.mark.engine
DEADLINE_S = 60  # each target's deadline (--timeout): the engines finish well inside it


@pytest.fixture(scope="module")
def engines():
    from opsctl.suite.invariance.run import ISOLATING_ARGS, ISOLATING_ENV

    kw = dict(load_format="dummy", max_model_len=256, max_num_seqs=8)
    isolated = dict(extra_args=list(ISOLATING_ARGS), env=dict(ISOLATING_ENV))
    with two_engines({**kw, **isolated}, kw) as (a, b):
        yield a.url, b.url


def certify(args: list[str], tmp: Path, env: dict[str, str] | None = None):
    junit, sarif = tmp / "ci" / "fleet.xml", tmp / "ci" / "fleet.sarif"
    cmd = [sys.executable, "-m", "opsctl", "certify", *args, "--json"]
    cmd += ["--junit", str(junit), "--sarif", str(sarif), "--timeout", f"{DEADLINE_S}s"]
    t0 = time.monotonic()
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, cwd=tmp, env={**os.environ, **(env or {})}
    )
    took = time.monotonic() - t0
    doc = json.loads(r.stdout)
    for t in doc["targets"]:  # shown when a test fails
        bad = [(c["check"], c["first_finding"]) for c in t["checks"] if c["verdict"] != "pass"]
        print(t["name"], t["verdict"], t["state"], t["duration_s"], bad)
    return r, doc, ET.parse(junit).getroot(), json.loads(sarif.read_text()), took


def by_name(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["targets"]}


def test_targets_file_hung_target_fails_liveness_others_pass(engines, tmp_path):
    a, b = engines
    with hung_server() as hung, keyed_server() as keyed:
        (tmp_path / "fleet.toml").write_text(
            f'[[targets]]\nname = "llama-a"\nurl = "{a}"\nlabels = {{ node = "n1" }}\n'
            f'[[targets]]\nname = "llama-b"\nurl = "{b}"\n'
            f'[[targets]]\nname = "wedged"\nurl = "{hung}"\n'
            f'[[targets]]\nname = "keyed"\nurl = "{keyed}"\napi_key_env = "FLEET_KEY"\n'
        )
        r, doc, junit, sarif, took = certify(
            ["--targets", "fleet.toml"], tmp_path, {"FLEET_KEY": KEY}
        )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == (
        "opsctl: error: certify failed on wedged (4 target(s): 3 passed, 1 failed)"
    )
    assert doc["schema"] == "opsctl.certify.fleet/1" and doc["verdict"] == "fail"
    t = by_name(doc)
    assert {n: e["verdict"] for n, e in t.items()} == {
        "llama-a": "pass", "llama-b": "pass", "wedged": "fail", "keyed": "pass",
    }  # fmt: skip
    (why,) = [c["reason"] for c in t["llama-b"]["checks"] if c["check"] == "invariance"]
    assert "prefix caching on" in why and "opsctl certify --checks invariance URL" in why
    for name, invariance in (("llama-a", "pass"), ("llama-b", None)):
        ran = {c["check"]: c["verdict"] for c in t[name]["checks"] if c["verdict"] != "skipped"}
        assert ran.pop("liveness") == "pass" and ran.pop("invariance", None) == invariance, ran
        assert set(ran.values()) <= {"pass", "unverified"}, ran  # patches, engram
        assert t[name]["fingerprint"]["model"]["name"] == "tiny-llama"
        assert t[name]["fingerprint"]["vllm_version"]  # the real server's version
        assert t[name]["duration_s"] < DEADLINE_S
    assert t["llama-a"]["labels"] == {"node": "n1"}
    assert t["keyed"]["fingerprint"]["vllm_version"] == "0.0-standin"
    wedged = t["wedged"]
    live = next(c for c in wedged["checks"] if c["check"] == "liveness")
    assert live["verdict"] == "fail" and wedged["fingerprint"]["vllm_version"] is None
    assert wedged["state"] == "unreachable" and "no HTTP answer within 30 s" in wedged["error"]
    # bounded by the slowest target, not by the sum of the targets (which target is the
    # slowest depends on the load: the real servers' checks took 45 s on 2 busy cores,
    # longer than the hung one's 30 s first-contact timeout)
    durations = [e["duration_s"] for e in doc["targets"]]
    assert wedged["duration_s"] < DEADLINE_S
    assert took < max(durations) + 20 and took < sum(durations), (took, durations)
    # ONE JUnit file: a testsuite per target, the hung one's liveness a failure
    suites = {s.find("properties/property[@name='target']").get("value"): s for s in junit}
    assert set(suites) == {"llama-a", "llama-b", "wedged", "keyed"}
    assert suites["wedged"].find("testcase[@name='liveness']/failure") is not None
    failed = {n: [c.get("name") for c in s.iter("testcase") if c.find("failure") is not None]
              for n, s in suites.items()}  # fmt: skip
    assert failed == {"llama-a": [], "llama-b": [], "wedged": ["liveness"], "keyed": []}
    # ONE SARIF log: a run per target; the hung one's liveness is an error result
    runs = {run["properties"]["target"]: run for run in sarif["runs"]}
    assert set(runs) == set(suites)
    errors = {n: [x["ruleId"] for x in run["results"] if x["level"] == "error"]
              for n, run in runs.items()}  # fmt: skip
    assert errors["llama-a"] == errors["llama-b"] == errors["keyed"] == []
    assert errors["wedged"] == ["liveness.unreachable"]


def test_invariance_asked_by_name_on_a_prefix_caching_server_stays_fail_closed(engines, tmp_path):
    a, b = engines
    r, doc, _junit, _sarif, _took = certify([a, b, "--checks", "invariance"], tmp_path)
    assert r.returncode == 1, r.stderr
    t = {e["target"]["url"]: e for e in doc["targets"]}
    inv = {u: next(c for c in e["checks"] if c["check"] == "invariance") for u, e in t.items()}
    assert inv[a]["verdict"] == "pass"
    assert inv[b]["verdict"] == "fail" and "prefix caching" in inv[b]["first_finding"]


def test_urls_wrong_key_fails_the_keyed_target_only(engines, tmp_path):
    a, b = engines
    with keyed_server() as keyed:
        r, doc, junit, sarif, took = certify(
            [a, b, keyed, "--api-key", "wrong-key", "--checks", "liveness"], tmp_path
        )
    assert r.returncode == 1, r.stderr
    t = {e["target"]["url"]: e for e in doc["targets"]}
    assert {u: e["verdict"] for u, e in t.items()} == {a: "pass", b: "pass", keyed: "fail"}
    assert t[keyed]["state"] == "unauthorized"
    failure = next(s for s in junit if "fail" in [
        p.get("value") for p in s.iter("property") if p.get("name") == "verdict"
    ]).find("testcase[@name='liveness']/failure")  # fmt: skip
    assert failure.get("type") == "liveness.unauthorized"
    assert len(sarif["runs"]) == 3 and took < DEADLINE_S
