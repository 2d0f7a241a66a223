"""`opsctl certify URL` against one real tiny-reranker engine (one engine start, by the
module fixture):

- the URL itself: usage passes (with liveness, the patch ledger read from the run
  directory opsctl left, Engram hygiene); the generative checks, kv-fail and shutdown
  are skipped with their reasons;
- a deliberately wrong server: a small local proxy in front of the same engine that adds
  tokens to /score usage. certify fails exactly usage, the same in JSON, JUnit and
  SARIF (both files schema-validated), exit 1.
"""

from __future__ import annotations

import contextlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
import xmlschema
from typer.testing import CliRunner

from opsctl.cli import app
from tests.conftest import running_engine
from tests.expect import expected, verdicts
from tests.standins.base import JSONHandler, serving

pytestmark = pytest.mark.engine

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
INFLATE = 3
runner = CliRunner()


@pytest.fixture(scope="module")
def engine():
    with running_engine("tiny-reranker") as server:
        yield server


@contextlib.contextmanager
def inflating_proxy(upstream: str) -> Iterator[str]:
    """Forward everything to ``upstream``; /score answers get usage + INFLATE."""

    class Proxy(JSONHandler):
        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {"Content-Type": self.headers.get("Content-Type") or "application/json"}
            r = httpx.request(
                method, upstream + self.path, content=body or None, headers=headers, timeout=120
            )
            data = r.content
            if self.path == "/score" and r.status_code == 200:
                doc = r.json()
                doc["usage"]["prompt_tokens"] += INFLATE
                doc["usage"]["total_tokens"] += INFLATE
                data = json.dumps(doc).encode()
            self._send_bytes(r.status_code, data, r.headers.get("content-type", "application/json"))

        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

    with serving(Proxy) as url:
        yield url


def certify(url: str, out: Path):
    junit, sarif = out / "report.xml", out / "report.sarif"
    r = runner.invoke(app, ["certify", url, "--json", "--junit", str(junit), "--sarif", str(sarif)])
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    assert doc is not None, r.stderr[-3000:]
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(junit))
    log = json.loads(sarif.read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    return r, doc, ET.parse(junit).getroot(), log


def test_url_of_a_reranker_passes_usage_and_skips_generative_checks(engine, tmp_path):
    r, doc, junit, log = certify(engine.url, tmp_path)
    assert r.exit_code == 0, r.stderr[-3000:]
    assert verdicts(doc) == expected(pass_="liveness patches engram usage")
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert (
        reasons["invariance"] == "cross-encoder model: batch invariance compares generated tokens"
    )
    assert reasons["mm-uuid"] == "cross-encoder model: no multimodal items to identify"
    assert reasons["kv-fail"].startswith("a URL cannot host kv-fail injection")
    assert reasons["shutdown"] == "opsctl did not start this server, so it does not stop it"
    assert doc["target"] == {"kind": "url", "url": engine.url}
    assert doc["fingerprint"]["model"]["name"] == "tiny-reranker"
    assert (doc["state"], doc["error"]) == ("ran", None)
    assert doc["summary"]["engine_starts"] == 0
    usage = next(c for c in doc["checks"] if c["check"] == "usage")
    assert usage["report"]["kind"] == "cross-encoder" and usage["report"]["rows"]
    live = next(c for c in doc["checks"] if c["check"] == "liveness")
    assert live["report"]["request"]["endpoint"] == "/score"
    assert live["report"]["counter"]["name"] == "vllm:prompt_tokens_total"
    fp = doc["fingerprint"]
    assert fp["platform"] == "cpu" and fp["vllm_version"]
    assert fp["engine_args"][0]["argv"] and fp["model"]["config_sha256"]
    assert junit.find("testsuite").get("skipped") == "4"
    assert not [x for x in log["runs"][0]["results"] if x["level"] == "error"]


def test_proxy_inflating_score_usage_fails_exactly_usage(engine, tmp_path):
    with inflating_proxy(engine.url) as url:
        r, doc, junit, log = certify(url, tmp_path)
    assert r.exit_code == 1, r.stderr[-3000:]
    failed = {c["check"] for c in doc["checks"] if c["verdict"] in ("fail", "error")}
    assert failed == {"usage"}
    in_junit = {c.get("name") for c in junit.iter("testcase") if c.find("failure") is not None}
    errors = log["runs"][0]["results"]
    in_sarif = {x["properties"]["check"] for x in errors if x["level"] == "error"}
    assert in_junit == in_sarif == failed
    assert {x["ruleId"] for x in errors if x["level"] == "error"} == {"usage.mismatch"}
    usage = next(c for c in doc["checks"] if c["check"] == "usage")
    rows = usage["report"]["rows"]
    score_rows = [row for row in rows if row["endpoint"] == "/score"]
    assert score_rows and all(
        row["reported_prompt_tokens"] == row["expected_tokens"] + INFLATE for row in score_rows
    )
    rerank_rows = [row for row in rows if row["endpoint"] == "/rerank"]  # not inflated
    assert rerank_rows and all(row["verdict"] == "pass" for row in rerank_rows)
    # the proxy is no opsctl engine: its ledger cannot be found, so that check is skipped
    patches = next(c for c in doc["checks"] if c["check"] == "patches")
    assert patches["verdict"] == "skipped" and "no opsctl run directory" in patches["reason"]
