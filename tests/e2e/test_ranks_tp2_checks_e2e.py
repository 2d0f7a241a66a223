"""The checks on a real TP=2 server (issue 44, item 6): the pooled `tp2` engine (tiny-llama,
real seeded weights, Worker_TP0 and Worker_TP1 under one EngineCore), no start of its own.

The pool's engine keeps vLLM's defaults (prefix caching on), so it is not isolated for
batch invariance: `diag invariance URL` compares BS=1 with a BS=N batch that really formed
(every prompt identical) and fails for that one setting, and `certify URL` reports every
check as it is: liveness, the patch ledger of every rank process (both workers included)
and Engram pass; invariance and the checks that need another kind of model or an engine
of their own are skipped with their reason."""

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


PREFIX_CACHING = "setting prefix caching: wanted off, engine has True"


def judged_as_is(rc: int, run: dict) -> None:
    """A server not isolated for the check (the pooled engine keeps vLLM's prefix caching):
    every prompt identical, the batch formed, and the verdict fails for that one setting."""
    prompts = run["prompts"]
    assert all(p["status"] == "identical" for p in prompts), prompts
    assert run["batch"]["formed"] is True and run["batch"]["max_batch"] >= 8, run["batch"]
    assert run["verdict"] == "fail" and run["summary"]["reasons"] == [PREFIX_CACHING], run
    assert rc == 1


def test_invariance_on_a_tp2_url(engine):
    rc, doc, _err = invoke("diag", "invariance", engine.url)
    (run,) = doc["runs"]
    judged_as_is(rc, run)
    assert not any("data-parallel" in w for w in run["warnings"])  # one engine: no pin


def certified_as_is(rc: int, doc: dict, err: str) -> dict:
    """certify URL: liveness, the patch ledger and Engram pass, invariance is skipped with
    the setting it would fail on; the patch ledger's processes."""
    assert verdicts(doc) == expected(pass_="liveness patches engram"), doc["checks"]
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert "prefix caching on" in reasons["invariance"], reasons
    assert rc == 0, err[-2000:]
    patches = next(c for c in doc["checks"] if c["check"] == "patches")["report"]
    return {p["pid"]: p["role"] for p in patches["summary"]["processes"]}


def test_certify_url_on_tp2_reports_every_check(engine):
    rc, doc, err = invoke("certify", engine.url)
    roles = certified_as_is(rc, doc, err)
    # the patch ledger of every rank process: the API server, the EngineCore, both workers
    assert sorted(roles.values()) == ["api_server", "engine_core", "worker", "worker"], roles
    records = read_records(engine.run_dir)
    assert {r["pid"] for r in records if r["role"] == "worker"} == {
        pid for pid, role in roles.items() if role == "worker"
    }
