"""`opsctl diag invariance` fails closed against a server that cannot return logprobs
(started with ``--max-logprobs 0``): a failure with the server's reason, exit 1, never
a pass or a skip. One engine start (the session pool's ``no-logprobs``: the tests only
read from it)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from opsctl.cli import app

pytestmark = [pytest.mark.engine, pytest.mark.pool("no-logprobs")]


@pytest.fixture(scope="module")
def engine(engine_pool):
    """tiny-llama with the isolating arguments and ``--max-logprobs 0``."""
    return engine_pool.engine("no-logprobs")


def test_server_without_logprobs_is_a_failure_with_that_reason(engine):
    r = CliRunner().invoke(app, ["diag", "invariance", engine.url, "--max-tokens", "4", "--json"])
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "fail"
    prompts = doc["runs"][0]["prompts"]
    assert len(prompts) == 8 and all(p["status"] == "error" for p in prompts)
    reason = prompts[0]["reason"]
    assert reason.startswith("BS=1: request error: HTTP 400")
    assert "greater than max allowed: 0" in reason
    assert "greater than max allowed: 0" in r.stderr  # the one stderr line says why
    assert doc["runs"][0]["summary"]["errors"] == 8 and doc["runs"][0]["summary"]["identical"] == 0
