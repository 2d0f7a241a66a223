"""certify's run logic with stand-in checks (pure: no server, no engine): a check that
raises is that check's ``error`` case while every other check is still judged and
reported; a certification that never reaches its checks (no vLLM server, certify itself
failing) is one failed (or errored) ``liveness`` case and the rest skipped, exit 3 (or
1). Each document goes through JUnit and SARIF, validated against the shipped schemas.
The real CLI against real servers: tests/cli/test_certify_cli.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema

from opsctl.checks import certify, certify_facts
from opsctl.checks import events as ev
from opsctl.checks.certify_plan import Facts
from opsctl.checks.report import Report
from opsctl.checks.target import UrlTarget
from opsctl.domain import certify as dom
from opsctl.errors import BadInput, EngineUnreachable
from opsctl.ui.render_junit import junit_xml
from opsctl.ui.render_sarif import sarif_log
from tests.expect import expected

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
URL = "http://127.0.0.1:9"
ARTIFACT = {"uri": "out/report.sarif", "uriBaseId": "%SRCROOT%"}


@pytest.fixture(scope="module")
def schemas() -> tuple[xmlschema.XMLSchema, dict]:
    junit = xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd"))
    return junit, json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())


def formats(doc: dict, schemas) -> tuple[ET.Element, dict]:
    """The document's JUnit (parsed) and SARIF, both validated."""
    junit_schema, sarif_schema = schemas
    text = junit_xml([doc])
    junit_schema.validate(text)
    log = sarif_log(doc, ARTIFACT)
    jsonschema.Draft4Validator(sarif_schema).validate(log)
    assert all(r["locations"] for r in log["runs"][0]["results"])
    return ET.fromstring(text), log


def passing(check: str) -> Report:
    finding = {"severity": "ok", "code": f"{check}.ok", "message": "fine"}
    return Report("pass", {"verdict": "pass", "findings": [finding]})


def test_a_check_that_raises_is_its_error_case_and_the_others_run(monkeypatch, schemas):
    subject = dom.Subject(managed=False, model="m", archetype="decoder", run_dir=True)
    facts = Facts(subject)
    selection = dom.select(subject)
    assert selection.run == ("liveness", "patches", "engram", "invariance")
    seen: list[ev.Event] = []
    job = certify._Job(
        UrlTarget(URL), certify.Options(), facts, selection, certify.CertifySession(), seen.append
    )
    called: list[str] = []

    def call(check: str, progress: ev.Progress) -> Report:
        called.append(check)
        if check == "patches":
            raise KeyError("ledger")  # a bug in one check
        return passing(check)

    monkeypatch.setattr(job, "call", call)
    monkeypatch.setattr(certify_facts, "fingerprint", lambda *a: certify_facts.bare_fingerprint())
    job.run_checks()
    report = certify._report(job, job.finish(), 1.0)
    assert called == ["liveness", "patches", "engram", "invariance"]  # the rest still ran
    doc = report.to_dict()
    assert report.verdicts() == expected(pass_="liveness engram invariance", error="patches")
    assert (doc["state"], doc["error"], doc["exit_code"]) == ("ran", None, 1)
    patches = next(c for c in doc["checks"] if c["check"] == "patches")
    assert patches["reason"] == "internal error: KeyError: 'ledger'"
    done = [(e.name, e.verdict) for e in seen if isinstance(e, certify.CheckDone)]
    assert ("patches", "error") in done and ("invariance", "pass") in done
    root, log = formats(doc, schemas)
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("8", "1", "0")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    error = cases["patches"].find("error")
    assert error is not None and error.get("type") == "patches.error"
    assert error.get("message") == "internal error: KeyError: 'ledger'"
    for name in ("liveness", "engram", "invariance"):
        assert list(cases[name].iter("error")) == list(cases[name].iter("failure")) == []
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["patches.error"]


def test_unreachable_is_one_failed_liveness_case_exit_3(schemas):
    error = EngineUnreachable(f"no server answered at {URL}: refused", hint="is it running?")
    report = certify.not_reached(UrlTarget(URL), error, 0.25)
    doc = report.to_dict()
    assert report.hint == "is it running?"
    assert doc["schema"] == "opsctl.certify/2"
    assert (doc["state"], doc["error"], doc["exit_code"]) == ("unreachable", error.message, 3)
    assert doc["target"] == {"kind": "url", "url": URL}
    assert doc["fingerprint"]["platform"] is None and doc["model_kind"] is None
    assert doc["summary"]["fail"] == 1 and doc["summary"]["skipped"] == 7
    root, log = formats(doc, schemas)
    assert root.find("testsuite").get("name") == f"certify {URL}"  # no model known
    failed = [c for c in root.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["liveness"]
    assert failed[0].find("failure").get("type") == "liveness.unreachable"
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "liveness.unreachable"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == ARTIFACT
    assert log["runs"][0]["invocations"][0] == {
        **log["runs"][0]["invocations"][0],
        "executionSuccessful": False,
        "exitCode": 3,
    }


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError("boom"), "internal error: RuntimeError: boom"),
        (BadInput("odd"), "certify failed before its checks: odd"),
    ],
)
def test_certify_failing_before_its_checks_is_an_error_case_exit_1(error, reason, schemas):
    doc = certify.not_reached(UrlTarget(URL), error, 0.1).to_dict()
    assert (doc["state"], doc["error"], doc["exit_code"]) == ("crashed", reason, 1)
    root, _ = formats(doc, schemas)
    assert root.find("testsuite/testcase[@name='liveness']/error").get("message") == reason


def test_exit_code_follows_the_state():
    results = dom.not_reached("x", 0.0)
    assert dom.exit_code(results, dom.UNREACHABLE) == 3
    assert dom.exit_code(results) == 1  # the same failed case once a server answered
    timed_out = [dom.errored("usage", "slow", 1.0, True)]
    assert dom.exit_code(timed_out, dom.RAN) == 4
    assert dom.exit_code([], dom.RAN) == 0


def test_conclusion_exit_code_and_stderr_line():
    unreachable = certify.not_reached(UrlTarget(URL), EngineUnreachable("nobody"), 0.1)
    assert dom.conclusion(unreachable.to_dict()) == (3, "nobody")
    crashed = certify.not_reached(UrlTarget(URL), RuntimeError("x"), 0.1)
    assert dom.conclusion(crashed.to_dict()) == (1, "internal error: RuntimeError: x")
    doc = {
        "state": "ran",
        "refused": [],
        "exit_code": 4,
        "summary": {**dom.counts([dom.errored("usage", "slow", 1.0, True)]), "engine_starts": 0},
        "checks": [dom.errored("usage", "slow", 1.0, True).to_dict()],
    }
    code, line = dom.conclusion(doc)
    assert code == 4 and line.startswith("certify: timed out (1 run, 0 passed, 0 failed, 1 errored")
    assert dom.conclusion({**doc, "refused": ["kv-fail"]}) == (
        2,
        "asked for but cannot run here: kv-fail",
    )
