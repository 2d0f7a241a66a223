"""certify over a fleet, the pure part (opsctl.domain.certify_fleet) and its formats:
a target concluded at its deadline is a failed liveness case (never a missing one) and
keeps what finished; the fleet passes only when every target passed; one JUnit file
with a testsuite per target (names and classnames per target), one SARIF log with a
run per target (distinct automation ids)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from opsctl.checks.certify_fleet import summary_rows
from opsctl.domain import certify as dom
from opsctl.domain import certify_fleet as fdom
from opsctl.ui.render_junit import junit_xml
from opsctl.ui.render_sarif import sarif_text

WHY = "no answer within the target's deadline (5 s, --timeout)"


def test_duplicate():
    assert fdom.duplicate(["a", "b", "a"]) == "a"
    assert fdom.duplicate(["a", "b"]) is None


def test_deadline_before_liveness_is_a_failed_liveness_case():
    results = fdom.deadline_results({}, None, 5.0, WHY, True)
    v = {r.check: r.verdict for r in results}
    assert v.pop("liveness") == "fail" and set(v.values()) == {"skipped"}
    live = results[0]
    assert live.findings[0].code == "liveness.deadline" and live.reason == WHY
    assert dom.exit_code(results, fdom.DEADLINE) == 1


def test_deadline_keeps_finished_checks_and_times_out_the_running_one():
    done = {"liveness": fdom.Done("pass", "", 0.4), "engram": fdom.Done("fail", "orphans", 0.1)}
    results = {r.check: r for r in fdom.deadline_results(done, "invariance", 5.0, WHY, True)}
    assert results["liveness"].verdict == "pass"
    assert results["engram"].verdict == "fail"
    assert results["engram"].findings[0].code == "engram.fail"
    inv = results["invariance"]
    assert (inv.verdict, inv.timed_out, inv.findings[0].code) == (
        "error",
        True,
        "invariance.timeout",
    )
    assert results["usage"].verdict == "skipped" and WHY in results["usage"].reason


def test_interrupted_does_not_invent_a_liveness_failure():
    results = fdom.deadline_results({}, "liveness", 1.0, "interrupted", False)
    live = results[0]
    assert live.verdict == "error" and not live.timed_out


def _entry(name: str, code: int, state: str = "ran") -> dict:
    checks = [dom.CheckResult("liveness", "pass" if code == 0 else "fail", 0.5).to_dict()]
    return {
        "name": name, "labels": {}, "verdict": "pass" if code == 0 else "fail",
        "state": state, "error": None, "exit_code": code, "target": {"kind": "url",
        "url": f"http://127.0.0.1:{8000 + len(name)}"}, "fingerprint": {"model": {"name": "m"}},
        "summary": dom.counts([]), "checks": checks, "duration_s": 1.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("codes", "verdict", "exit_code"),
    [
        ((0, 0), "pass", 0),
        ((0, 1), "fail", 1),
        ((0, 3), "fail", 1),
        ((4,), "fail", 1),
        ((), "fail", 1),
    ],
)
def test_fleet_passes_only_when_every_target_passed(codes, verdict, exit_code):
    entries = [_entry(f"t{i}", c) for i, c in enumerate(codes)]
    fields = fdom.fleet_fields(entries, interrupted=False)
    assert (fields["verdict"], fields["exit_code"]) == (verdict, exit_code)
    assert fields["summary"]["passed"] == sum(c == 0 for c in codes)


def test_interrupted_fleet_is_130_and_conclusion_names_the_failed():
    entries = [_entry("a", 0), _entry("bb", 1)]
    assert fdom.fleet_fields(entries, interrupted=True)["exit_code"] == 130
    doc = {**fdom.fleet_fields(entries, interrupted=False), "targets": entries}
    assert fdom.conclusion(doc) == (1, "certify failed on bb (2 target(s): 1 passed, 1 failed)")


def test_junit_and_sarif_one_suite_and_one_run_per_target():
    entries = [_entry("a", 0), _entry("bb", 1)]
    root = ET.fromstring(junit_xml(entries).split("\n", 1)[1])
    names = [s.get("name") for s in root.findall("testsuite")]
    assert [n.split(":")[0] for n in names] == ["a", "bb"]
    classes = {c.get("classname") for c in root.iter("testcase")}
    assert classes == {"opsctl.certify.a.liveness", "opsctl.certify.bb.liveness"}
    log = json.loads(sarif_text(entries, "/repo", "/repo/ci/fleet.sarif"))
    assert [r["properties"]["target"] for r in log["runs"]] == ["a", "bb"]
    assert [r["automationDetails"]["id"] for r in log["runs"]] == [
        "opsctl-certify/a/", "opsctl-certify/bb/",
    ]  # fmt: skip


def test_summary_rows_show_the_first_failure():
    e = _entry("bb", 1, "unreachable")
    e["error"] = "no server answered at http://127.0.0.1:8002: ConnectError"
    (row,) = summary_rows([e])
    assert row[:4] == ["bb", "http://127.0.0.1:8002", "FAIL", "unreachable"]
    assert row[5].startswith("no server answered")
