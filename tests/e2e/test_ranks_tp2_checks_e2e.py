"""The checks on a real TP=2 server (issue 44, item 6): the pooled `tp2` engine (tiny-llama,
real seeded weights, Worker_TP0 and Worker_TP1 under one EngineCore), no start of its own.

`diag invariance URL` compares BS=1 with a BS=N batch that really formed, and `certify URL`
reports every check as it is: the liveness of the server, the patch ledger of every rank
process (both workers included), batch invariance; the checks that need another kind of
model or an engine of their own are skipped with their reason."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors.ledger import read_records
from tests.expect import expected, verdicts

pytestmark = [pytest.mark.engine, pytest.mark.pool("tp2")]

runner = CliRunner()


@pytest.fixture(scope="module")
def engine(engine_pool):
    return engine_pool.engine("tp2")


def invoke(*args: str) -> tuple[int, dict, str]:
    r = runner.invoke(app, [*args, "--json"])
    assert r.stdout.strip(), r.stderr[-3000:]
    return r.exit_code, json.loads(r.stdout), r.stderr


def judged_as_measured(rc: int, run: dict) -> None:
    """Tokens equal; the verdict (and the exit code) follow the bitwise comparison."""
    prompts = run["prompts"]
    assert all(p["tokens_identical"] and p["status"] != "error" for p in prompts), prompts
    identical = all(p["status"] == "identical" for p in prompts)
    assert run["verdict"] == ("pass" if identical else "fail"), run["summary"]
    assert rc == (0 if identical else 1)
    assert run["batch"]["formed"] is True and run["batch"]["max_batch"] >= 8, run["batch"]


def test_invariance_on_a_tp2_url(engine):
    rc, doc, _err = invoke("diag", "invariance", engine.url)
    (run,) = doc["runs"]
    judged_as_measured(rc, run)
    assert not any("data-parallel" in w for w in run["warnings"])  # one engine: no pin


def test_certify_url_on_tp2_reports_every_check(engine):
    rc, doc, err = invoke("certify", engine.url)
    inv = next(c for c in doc["checks"] if c["check"] == "invariance")
    run = inv["report"]["runs"][0]
    judged = "pass" if all(p["status"] == "identical" for p in run["prompts"]) else "fail"
    judged_as_measured(0 if judged == "pass" else 1, run)
    assert verdicts(doc) == expected(pass_="liveness patches engram", **{judged: "invariance"})
    assert rc == (0 if judged == "pass" else 1), err[-2000:]
    # the patch ledger of every rank process was read: the API server, the EngineCore and
    # both TP workers
    records = read_records(engine.run_dir)
    roles = sorted(r["role"] for r in records if r["role"] != "model_inspector")
    assert roles == ["api_server", "engine_core", "worker", "worker"], roles
