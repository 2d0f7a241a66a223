"""certify's pure parts: check selection and skip reasons, verdicts and exit codes, the
summary rows, and the JUnit XML / SARIF 2.1.0 made from one document, validated against
the schemas shipped in tests/data/schemas (see its README for where they come from)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema

from opsctl.checks.certify import summary_rows
from opsctl.domain import certify as dom
from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding
from opsctl.ui.render_junit import junit_xml
from opsctl.ui.render_sarif import artifact_for, rule_name, sarif_log

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


@pytest.fixture(scope="module")
def sarif_schema() -> dict:
    return json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def junit_schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd"))


def validate_sarif(log: dict, schema: dict) -> None:
    jsonschema.Draft4Validator(schema).validate(log)
    for run in log["runs"]:  # what code scanning needs beyond the schema
        for r in run["results"]:
            assert r["locations"], r
            assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]


# ---- selection -----------------------------------------------------------------------------

LLAMA = dom.Subject(
    managed=True, model="tiny-llama", archetype="decoder", kv_groups=1, run_dir=True
)
VLM = dom.Subject(
    managed=True,
    model="tiny-vlm-multi",
    archetype="vision-language",
    kv_refusal="architecture Idefics3ForConditionalGeneration is not a decoder",
    run_dir=True,
)
RERANKER_URL = dom.Subject(
    managed=False, model="tiny-reranker", archetype="cross-encoder", run_dir=True
)
REMOTE = dom.Subject(managed=False, model="m", archetype="decoder", local=False)


@pytest.mark.parametrize(
    ("subject", "run", "skipped"),
    [
        (
            LLAMA,
            ("liveness", "patches", "engram", "invariance", "kv-fail", "shutdown"),
            ("usage", "mm-uuid"),
        ),
        (
            VLM,
            ("liveness", "patches", "engram", "invariance", "mm-uuid", "shutdown"),
            ("usage", "kv-fail"),
        ),
        (
            RERANKER_URL,
            ("liveness", "patches", "engram", "usage"),
            ("invariance", "mm-uuid", "kv-fail", "shutdown"),
        ),
        (
            REMOTE,
            ("liveness", "invariance"),
            ("patches", "engram", "usage", "mm-uuid", "kv-fail", "shutdown"),
        ),
    ],
)
def test_selection_by_model_and_target_kind(subject, run, skipped):
    sel = dom.select(subject)
    assert sel.run == run
    assert tuple(sel.skipped) == skipped
    assert all(sel.skipped.values())  # every skip says why


def test_skip_reasons_name_the_cause():
    sel = dom.select(RERANKER_URL)
    assert "URL cannot host kv-fail" in sel.skipped["kv-fail"]
    assert "cross-encoder model" in sel.skipped["invariance"]
    assert "did not start" in sel.skipped["shutdown"]
    assert "cannot serve tiny-vlm-multi" in dom.select(VLM).skipped["kv-fail"]


def test_checks_and_skip_flags():
    sel = dom.select(LLAMA, only=("liveness", "kv-fail"))
    assert sel.run == ("liveness", "kv-fail")
    assert sel.skipped["invariance"] == "not selected (--checks)"
    sel = dom.select(LLAMA, skip=("kv-fail",))
    assert "kv-fail" not in sel.run and sel.skipped["kv-fail"] == "skipped on request (--skip)"
    with pytest.raises(ValueError, match="cannot run kv-fail: a URL cannot host"):
        dom.select(RERANKER_URL, only=("kv-fail",))
    with pytest.raises(ValueError, match="both"):
        dom.select(LLAMA, only=("liveness",), skip=("liveness",))
    with pytest.raises(ValueError, match="unknown check"):
        dom.parse_list("liveness,bogus", "--checks")


# ---- results -------------------------------------------------------------------------------


def results() -> list[dom.CheckResult]:
    usage_doc = {
        "verdict": "fail",
        "findings": [
            {
                "severity": "fail",
                "code": "usage.mismatch",
                "message": "score cross-encoder 'one pair': reported 12, expected 9",
                "details": {"row": {"reported": 12, "expected": 9}},
            }
        ],
    }
    inv_doc = {
        "verdict": "fail",
        "reasons": ["[default] prompt 0 diverged at position 3"],
        "runs": [{"mode": "default", "warnings": ["nudge active"]}],
        "warnings": ["TEST KNOBS active in this engine (OPSCTL_PROBE_NUDGE=fox:3): ..."],
    }
    live_doc = {
        "verdict": "pass",
        "findings": [{"severity": "ok", "code": "liveness.progress", "message": "advanced"}],
    }
    return [
        dom.judged("liveness", live_doc, 1.5, (0,)),
        dom.skipped("patches", "no opsctl run directory"),
        dom.judged("usage", usage_doc, 2.25, (0,)),
        dom.judged("invariance", inv_doc, 3.0, (0,)),
        dom.errored("kv-fail", "engine did not become healthy within 5 s", 5.0, True),
    ]


def test_findings_normalised_and_verdicts():
    res = {r.check: r for r in results()}
    assert [f.code for f in res["invariance"].findings] == [
        "invariance.divergence",
        "invariance.warning",
        "certify.test_knobs",
    ]
    assert res["usage"].first_finding().code == "usage.mismatch"
    assert res["liveness"].headline() == ""  # an ok finding is no headline
    assert res["kv-fail"].verdict == "error" and res["kv-fail"].timed_out
    assert dom.overall(results()) == "fail"
    assert dom.exit_code(results()) == 1
    assert dom.exit_code([dom.errored("x", "t", 1.0, True), dom.skipped("y", "n")]) == 4
    # a check that ran without a judgement is never counted as passed (issue 45): certify's
    # verdict is inconclusive and it exits 1, also when the rest passed
    unjudged = [dom.judged("liveness", {"verdict": "unverified"}, 1.0)]
    unjudged.append(dom.judged("kv-fail", {"verdict": "inconclusive"}, 1.0))
    assert [r.verdict for r in unjudged] == ["unverified", "inconclusive"]
    assert dom.exit_code(unjudged) == 1 and dom.overall(unjudged) == "inconclusive"
    assert dom.exit_code([dom.judged("liveness", {"verdict": "pass"}, 1.0)]) == 0
    # a failed verdict without a failing finding still says why
    bare = dom.judged("usage", {"verdict": "fail"}, 1.0)
    assert bare.findings[0].code == "usage.failed"


def test_summary_rows():
    rows = summary_rows([r.to_dict() for r in results()], width=30)
    assert rows[0] == ["liveness", "PASS", "1.5 s", "-"]
    assert rows[1] == ["patches", "skipped", "-", "no opsctl run directory"]
    assert rows[2][:3] == ["usage", "FAIL", "2.2 s"] and rows[2][3].endswith("…")
    assert len(rows[2][3]) == 30
    counts = dom.counts(results())
    assert counts["run"] == 4 and counts["skipped"] == 1 and counts["error"] == 1


# ---- formats -------------------------------------------------------------------------------


def document(res: list[dom.CheckResult]) -> dict:
    return {
        "schema": "opsctl.certify/2",
        "verdict": dom.overall(res),
        "state": "ran",
        "error": None,
        "exit_code": dom.exit_code(res),
        "target": {"kind": "url", "url": "http://127.0.0.1:8000"},
        "fingerprint": {
            "vllm_version": "0.32.0",
            "platform": "cpu",
            "model": {
                "name": "tiny-reranker",
                "path": "/models/tiny-reranker",
                "config_sha256": "ab" * 32,
                "weights": [{"file": "model.safetensors", "size_bytes": 10, "sha256": "cd" * 32}],
            },
            "engine_args": [{"engine": 0, "argv": ["python", "-m", "vllm"]}],
            "patch_ledger": {"failed": [], "patches": {"p": {"applied": 2}}},
            "opsctl_version": "0.1.0",
        },
        "summary": {**dom.counts(res), "engine_starts": 1},
        "checks": [r.to_dict() for r in res],
        "duration_s": 12.3456,
    }


def test_junit_matches_document_and_schema(junit_schema):
    doc = document(results())
    text = junit_xml([doc], timestamp="2026-12-01T00:00:00")
    junit_schema.validate(text)
    root = ET.fromstring(text)
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "certify tiny-reranker (http://127.0.0.1:8000)"
    assert suite.get("time") == "12.346" and suite.find("testcase").get("time") == "1.500"
    assert suite.get("tests") == "5" and suite.get("failures") == "2"
    assert suite.get("errors") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["liveness"].find("failure") is None and cases["liveness"].find("skipped") is None
    assert cases["patches"].find("skipped").get("message") == "no opsctl run directory"
    failure = cases["usage"].find("failure")
    assert failure.get("type") == "usage.mismatch" and "reported 12" in failure.get("message")
    assert '"expected": 9' in failure.text  # the finding's details travel with it
    assert cases["kv-fail"].find("error").get("type") == "kv-fail.timeout"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["fingerprint.vllm_version"] == "0.32.0"
    assert props["fingerprint.model.config_sha256"] == "ab" * 32
    assert json.loads(props["fingerprint.model.weights"])[0]["sha256"] == "cd" * 32
    assert props["fingerprint.platform"] == "cpu"


def test_junit_several_targets_and_odd_text(junit_schema):
    odd = dom.judged(
        "usage",
        {
            "verdict": "fail",
            "findings": [
                {"severity": "fail", "code": "usage.mismatch", "message": 'a <b> & "c"\x1b'}
            ],
        },
        1.0,
    )
    text = junit_xml([document(results()), document([odd])])
    junit_schema.validate(text)
    root = ET.fromstring(text)
    assert len(root.findall("testsuite")) == 2 and root.get("tests") == "6"


def test_sarif_rules_levels_locations(sarif_schema):
    doc = document(results())
    artifact = {"uri": "models/tiny-reranker/config.json", "uriBaseId": "%SRCROOT%"}
    log = sarif_log(doc, artifact)
    validate_sarif(log, sarif_schema)
    (run,) = log["runs"]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert ids == sorted(set(ids))  # one rule per code, stable order
    assert set(ids) == {
        "usage.mismatch",
        "invariance.divergence",
        "invariance.warning",
        "certify.test_knobs",
        "kv-fail.timeout",
    }
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    assert levels["usage.mismatch"] == "error" and levels["invariance.warning"] == "warning"
    for r in run["results"]:
        assert run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["locations"][0]["physicalLocation"]["artifactLocation"] == artifact
    # an ok finding is no result; a skipped check is a notification
    assert "liveness.progress" not in levels
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert [n["message"]["text"] for n in notes] == ["patches skipped: no opsctl run directory"]
    # the same findings again give the same fingerprints (alerts track across runs)
    again = sarif_log(document(results()), artifact)
    assert [r["partialFingerprints"] for r in again["runs"][0]["results"]] == [
        r["partialFingerprints"] for r in run["results"]
    ]


def test_sarif_info_is_note_and_empty_run_valid(sarif_schema):
    res = [dom.CheckResult("engram", "pass", 1.0, findings=(Finding(INFO, "engram.none", "none"),))]
    log = sarif_log(document(res), {"uri": "file:///tmp/report.sarif"})
    validate_sarif(log, sarif_schema)
    assert log["runs"][0]["results"][0]["level"] == "note"
    clean = [
        dom.CheckResult("liveness", "pass", 1.0, findings=(Finding(OK, "liveness.progress", "x"),))
    ]
    log = sarif_log(document(clean), {"uri": "file:///tmp/report.sarif"})
    validate_sarif(log, sarif_schema)
    assert log["runs"][0]["results"] == [] and log["runs"][0]["tool"]["driver"]["rules"] == []


@pytest.mark.parametrize(
    ("config", "report", "expected"),
    [
        ("/repo/models/m/config.json", "/repo/out/r.sarif", ("models/m/config.json", "%SRCROOT%")),
        ("/cache/m/config.json", "/repo/out/r.sarif", ("out/r.sarif", "%SRCROOT%")),
        (None, "/tmp/r.sarif", ("file:///tmp/r.sarif", None)),
    ],
)
def test_artifact_for(config, report, expected):
    a = artifact_for("/repo", config, report)
    assert (a["uri"], a.get("uriBaseId")) == expected


def test_rule_name():
    assert rule_name("kv-fail.engine_died") == "KvFailEngineDied"


def test_severities_map_to_sarif_levels():
    res = [
        dom.CheckResult(
            "usage",
            "fail",
            findings=(
                Finding(FAIL, "a.fail", "x"),
                Finding(WARNING, "a.warn", "y"),
                Finding(INFO, "a.info", "z"),
            ),
        )
    ]
    log = sarif_log(document(res), {"uri": "file:///r"})
    assert [r["level"] for r in log["runs"][0]["results"]] == ["error", "warning", "note"]


def test_an_inconclusive_check_is_its_own_verdict_in_json_junit_and_sarif(
    junit_schema, sarif_schema
):
    """A comparison that could not tell right from wrong (issue 45): never a pass. certify's
    document says inconclusive (exit 1), JUnit a failure typed `<check>.inconclusive`, SARIF
    an `open` result (the spec's kind for a tool that could not decide, level none)."""
    why = "noise floor 0.03 and corrupted blocks 0.05: not clearly apart (try float32)"
    unsure = dom.judged(
        "kv-fail",
        {
            "verdict": "inconclusive",
            "findings": [{"severity": "warning", "code": "kv_fail.inconclusive", "message": why}],
        },
        2.0,
    )
    res = [dom.CheckResult("liveness", "pass", 1.0), unsure]
    doc = document(res)
    assert dom.overall(res) == "inconclusive" and dom.exit_code(res) == 1
    code, line = dom.conclusion({**doc, "state": "ran", "refused": [], "exit_code": 1})
    assert code == 1 and line.startswith("certify inconclusive: kv-fail not judged")
    assert "1 passed" in line and "1 not judged" in line
    text = junit_xml([doc])
    junit_schema.validate(text)
    (suite,) = ET.fromstring(text).findall("testsuite")
    assert suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["kv-fail"].find("failure").get("type") == "kv-fail.inconclusive"
    assert cases["liveness"].find("failure") is None
    log = sarif_log(doc, {"uri": "file:///tmp/report.sarif"})
    validate_sarif(log, sarif_schema)
    (opened,) = [r for r in log["runs"][0]["results"] if r.get("kind") == "open"]
    assert opened["ruleId"] == "kv-fail.inconclusive" and opened["level"] == "none"
    assert why in opened["message"]["text"] or "not judged" in opened["message"]["text"]
