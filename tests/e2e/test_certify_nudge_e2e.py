"""certify as a library call (opsctl.checks.certify.run) on a deliberately wrong engine:
tiny-llama with the batch nudge test knob armed through the test-only path (EngineSpec
knobs: the only way a knob reaches an engine). The nudge moves the largest logit of the
prompt containing "fox" at output position 3 whenever it is batched with others, so BS=1
and BS=N differ: invariance must fail. The patch ledger records the active knob, so the
ledger check fails too ("knobs off" is part of a sane ledger). Every other check passes:
the failed set is exactly {invariance, patches}, the same in JSON, JUnit and SARIF.
kv-fail is skipped (--skip) to keep this to one engine start.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema

from engine_patches import knobs
from opsctl.checks import certify
from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec
from opsctl.ui.render_junit import junit_xml
from opsctl.ui.render_sarif import sarif_log

pytestmark = pytest.mark.engine

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


@pytest.fixture(scope="module")
def nudged():
    seen: list[ev.Event] = []
    spec = EngineSpec(model="tiny-llama", knobs=((knobs.NUDGE, "fox:3"),))
    report = certify.run(spec, certify.Options(skip=("kv-fail",)), seen.append)
    return report, seen


def test_fails_exactly_invariance_and_the_ledger(nudged):
    report, _ = nudged
    doc = report.to_dict()
    assert report.verdict == "fail" and report.exit_code == 1
    verdicts = report.verdicts()
    failed = {c for c, v in verdicts.items() if v in ("fail", "error")}
    assert failed == {"invariance", "patches"}, doc["checks"]
    assert verdicts["liveness"] == verdicts["engram"] == verdicts["shutdown"] == "pass"
    assert verdicts["kv-fail"] == "skipped"
    inv = next(c for c in doc["checks"] if c["check"] == "invariance")
    assert inv["findings"][0]["code"] == "invariance.divergence"
    messages = [f["message"] for f in inv["findings"]]
    assert any("prompt 0: first divergence at position 3" in m for m in messages), messages
    patches = next(c for c in doc["checks"] if c["check"] == "patches")
    assert patches["findings"][0]["code"] == "patches.test_knobs"
    assert "OPSCTL_PROBE_NUDGE=fox:3" in patches["findings"][0]["message"]
    assert doc["fingerprint"]["patch_ledger"]["test_knobs"] == {knobs.NUDGE: "fox:3"}
    assert doc["summary"]["engine_starts"] == 1
    assert doc["engines"][0]["served"] == ["liveness", "patches", "engram", "invariance"]


def test_same_failures_in_junit_and_sarif(nudged, tmp_path):
    report, _ = nudged
    doc = report.to_dict()
    xml_text = junit_xml([doc])
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(xml_text)
    log = sarif_log(doc, {"uri": (tmp_path / "report.sarif").as_uri()})
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    root = ET.fromstring(xml_text)
    in_junit = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    results = log["runs"][0]["results"]
    in_sarif = {r["properties"]["check"] for r in results if r["level"] == "error"}
    assert in_junit == in_sarif == {"invariance", "patches"}
    assert {r["ruleId"] for r in results if r["level"] == "error"} == {
        "invariance.divergence",
        "patches.test_knobs",
    }


def test_typed_events_one_case_per_check(nudged):
    _, seen = nudged
    done = [(e.name, e.verdict) for e in seen if isinstance(e, certify.CheckDone)]
    assert done == [
        ("liveness", "pass"),
        ("patches", "fail"),
        ("engram", "pass"),
        ("invariance", "fail"),
        ("shutdown", "pass"),
    ]
    started = [e.check for e in seen if isinstance(e, certify.CheckStarted)]
    assert started == [c for c, _ in done]
    # the engine's own events arrive inside the check that caused them
    starting = [e for e in seen if isinstance(e, certify.CheckProgress)]
    assert [e.check for e in starting if isinstance(e.event, ev.EngineStarting)] == ["liveness"]
    reused = [e.check for e in starting if isinstance(e.event, ev.EngineReady) and e.event.reused]
    assert reused == ["patches", "engram", "invariance"]
    stops = [e for e in seen if isinstance(e, ev.EngineStopped)]
    assert len(stops) == 1 and stops[0].leftover_pids == ()
    assert isinstance(seen[-1], ev.Finished) and seen[-1].verdict == "fail"
