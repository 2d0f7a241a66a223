"""`opsctl certify` without a real engine: flag errors (exit 2), an unreachable URL (exit
3), and whole certifications of stand-in servers (tests/standin_completions.py): a
generative stand-in with an opsctl run directory passes liveness, the patch ledger,
Engram hygiene and invariance and skips the rest with reasons; a stand-in that diverges
under batching fails invariance alone, identically in JSON, JUnit and SARIF. The library
entry point (opsctl.checks.certify.run) is called directly for its typed events."""

from __future__ import annotations

import contextlib
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from typer.testing import CliRunner

from opsctl.checks import certify
from opsctl.checks import events as ev
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from tests.standin_completions import Behaviour, completions_server, register_run, write_run_dir

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An OPSCTL_HOME of this test (its own runs/) that still has the built models."""
    real = Path(os.environ["OPSCTL_HOME"])
    h = tmp_path / "home"
    (h / "runs").mkdir(parents=True)
    (h / "models").symlink_to(real / "models", target_is_directory=True)
    monkeypatch.setenv("OPSCTL_HOME", str(h))
    return h


@contextlib.contextmanager
def standin(home: Path, **behaviour) -> Iterator[str]:
    """A generative stand-in whose run directory find_run_dir() finds from its URL."""
    run_dir = home / "runs" / "standin"
    write_run_dir(run_dir)
    with completions_server(Behaviour(run_dir=run_dir, **behaviour)) as (url, _):
        register_run(run_dir, url)
        yield url


def invoke(*args: str, tmp: Path):
    junit, sarif = tmp / "report.xml", tmp / "report.sarif"
    r = runner.invoke(
        app, ["certify", *args, "--json", "--junit", str(junit), "--sarif", str(sarif)]
    )
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r, doc, junit, sarif


def validated(junit: Path, sarif: Path) -> tuple[ET.Element, dict]:
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(junit))
    log = json.loads(sarif.read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    assert all(r["locations"] for r in log["runs"][0]["results"])
    return ET.parse(junit).getroot(), log


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((), "give a server URL or --model"),
        (("http://127.0.0.1:9", "--model", "tiny-llama"), "not both"),
        (("--model", "tiny-llama", "--checks", "liveness,bogus"), "unknown check(s) bogus"),
        (("--model", "tiny-llama", "--timeout", "0"), "--timeout must be positive"),
        (("--model", "tiny-llama", "--checks", "usage"), "cannot run usage: decoder model"),
        (("--model", "tiny-llama", "--checks", "kv-fail", "--skip", "kv-fail"), "both"),
        (("--model", "no-such-model"), "unknown embedded model"),
    ],
)
def test_usage_errors_exit_2(args, text):
    r = runner.invoke(app, ["certify", *args])
    assert r.exit_code == 2, r.stderr
    assert text in r.stderr


def test_unreachable_url_exit_3():
    r = runner.invoke(app, ["certify", "http://127.0.0.1:9"])
    assert r.exit_code == 3 and "no server answered" in r.stderr


def test_checks_naming_a_check_a_url_cannot_run_is_exit_2(home):
    with standin(home) as url:
        r = runner.invoke(app, ["certify", url, "--checks", "liveness,kv-fail"])
    assert r.exit_code == 2
    assert "kv-fail: a URL cannot host kv-fail injection" in r.stderr


def test_standin_passes_applicable_checks_and_skips_the_rest(home, tmp_path):
    with standin(home) as url:
        r, doc, junit, sarif = invoke(url, tmp=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert doc["schema"] == "opsctl.certify/1" and doc["verdict"] == "pass"
    verdicts = {c["check"]: c["verdict"] for c in doc["checks"]}
    assert verdicts == {
        "liveness": "pass",
        "patches": "pass",
        "engram": "pass",
        "usage": "skipped",
        "invariance": "pass",
        "mm-uuid": "skipped",
        "kv-fail": "skipped",
        "shutdown": "skipped",
    }
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert "pooling model" in reasons["usage"] and "URL cannot host" in reasons["kv-fail"]
    assert doc["summary"]["engine_starts"] == 0 and doc["engines"] == []
    live = next(c for c in doc["checks"] if c["check"] == "liveness")
    assert live["report"]["counter"]["after"] > live["report"]["counter"]["before"]
    assert doc["fingerprint"]["vllm_version"] == "0.0-standin"
    root, log = validated(junit, sarif)
    assert root.find("testsuite").get("failures") == "0"
    assert log["runs"][0]["invocations"][0]["exitCode"] == 0
    assert not [x for x in log["runs"][0]["results"] if x["level"] == "error"]
    # the human summary: one row per check
    with completions_server(Behaviour()) as (plain_url, _):
        r = runner.invoke(app, ["certify", plain_url, "--checks", "liveness"])
    assert r.exit_code == 0, r.stderr
    assert "liveness" in r.stdout and "PASS" in r.stdout and "verdict: PASS" in r.stdout


def test_diverging_standin_fails_invariance_alone_in_every_format(home, tmp_path):
    with standin(home, diverge=("fox", 3, 0.01)) as url:
        r, doc, junit, sarif = invoke(url, tmp=tmp_path)
    assert r.exit_code == 1
    assert "certify failed: invariance" in r.stderr
    failed = {c["check"] for c in doc["checks"] if c["verdict"] in ("fail", "error")}
    assert failed == {"invariance"}
    root, log = validated(junit, sarif)
    in_junit = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    errors = {x["properties"]["check"] for x in log["runs"][0]["results"] if x["level"] == "error"}
    assert in_junit == errors == failed
    rule = next(x for x in log["runs"][0]["results"] if x["level"] == "error")["ruleId"]
    assert rule == "invariance.divergence"


def test_library_call_typed_events_one_case_per_check(home):
    seen: list[ev.Event] = []
    with standin(home) as url:
        report = certify.run(UrlTarget(url), certify.Options(skip=("engram",)), seen.append)
    assert report.verdict == "pass" and report.exit_code == 0
    started = [e.check for e in seen if isinstance(e, certify.CheckStarted)]
    done = [(e.name, e.verdict) for e in seen if isinstance(e, certify.CheckDone)]
    assert started == ["liveness", "patches", "invariance"]
    assert done == [("liveness", "pass"), ("patches", "pass"), ("invariance", "pass")]
    inner = [e for e in seen if isinstance(e, certify.CheckProgress)]
    assert {e.check for e in inner} == {"liveness", "patches", "invariance"}
    assert any(isinstance(e.event, ev.Finished) for e in inner)
    assert isinstance(seen[0], ev.Started) and isinstance(seen[-1], ev.Finished)
    assert report.verdicts()["engram"] == "skipped"


def test_a_check_timing_out_is_exit_4_and_reported_as_error(tmp_path):
    from tests.standin_scoring import stand_in

    with stand_in(sleep=3.0) as url:
        r, doc, junit, sarif = invoke(url, "--checks", "usage", "--timeout", "1", tmp=tmp_path)
    assert r.exit_code == 4, r.stderr
    usage = next(c for c in doc["checks"] if c["check"] == "usage")
    assert usage["verdict"] == "error" and usage["timed_out"]
    assert doc["exit_code"] == 4
    root, log = validated(junit, sarif)
    assert root.find("testsuite/testcase[@name='usage']/error") is not None
    assert [x["ruleId"] for x in log["runs"][0]["results"]] == ["usage.timeout"]
