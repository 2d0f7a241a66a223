"""`opsctl diag invariance --model tiny-llama --mode both`: opsctl starts the engine
itself twice (vLLM's default execution mode on this platform, then --enforce-eager),
with the isolating settings, and shows both verdicts side by side. Two engine starts;
one more for two library calls sharing one engine through an EngineSession.

Verdicts are whatever the platform gives (a bitwise logprob difference on CPU is a
finding, not a bug): the test checks tokens, that the settings and the mode reached each
engine, that the batch formed, and that the exit code follows the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks import invariance as check
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec
from opsctl.cli import app

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def both():
    r = CliRunner().invoke(
        app, ["diag", "invariance", "--model", "tiny-llama", "--mode", "both", "--json"]
    )
    return r, json.loads(r.stdout)


def test_both_modes_side_by_side(both):
    r, doc = both
    runs = {run["mode"]: run for run in doc["runs"]}
    assert list(runs) == ["default", "eager"]
    assert runs["default"]["execution"] == {
        "enforce_eager": False,
        "compilation_mode": "DYNAMO_TRACE_ONCE",
    }
    assert runs["eager"]["execution"] == {"enforce_eager": True, "compilation_mode": "NONE"}
    for run in runs.values():
        assert run["external"] is False and run["platform"] == "cpu"
        assert run["vllm_version"]
        assert all(p["tokens_identical"] for p in run["prompts"]), run["prompts"]
        assert run["batch"]["formed"] is True and run["batch"]["max_batch"] == 8
        status = {s["name"]: s["status"] for s in run["settings"]}
        assert status == {
            "prefix caching": "verified",
            "mm processor cache": "not applicable",
            "VLLM_USE_FLASHINFER_SAMPLER": "verified",
            "execution mode": "verified",
            "greedy (temperature 0)": "verified",
            "ignore_eos": "verified",
        }
        identical = all(p["status"] == "identical" for p in run["prompts"])
        assert run["verdict"] == ("pass" if identical else "fail")
    overall = all(run["verdict"] == "pass" for run in runs.values())
    assert doc["verdict"] == ("pass" if overall else "fail")
    assert r.exit_code == (0 if overall else 1), r.stderr
    # the engines are gone: stopped by the diag itself
    for run in runs.values():
        meta = json.loads((Path(run["run_dir"]) / "meta.json").read_text())
        assert meta["stop"]["leftover_pids"] == []


def test_two_calls_in_one_session_share_the_isolated_engine():
    seen: list[ev.Event] = []
    with EngineSession() as session:
        first = check.run(
            EngineSpec(), check.Options(mode="eager", max_tokens=4), seen.append, session
        )
        options = check.Options(mode="eager", max_tokens=4, batch_size=4)
        second = check.run(EngineSpec(), options, seen.append, session)
        (start,) = session.starts  # one engine served both calls
        assert start.served == ["invariance-eager", "invariance-eager"]
        assert start.spec.probes >= {"batch"} and start.spec.enforce_eager is True
    assert [e.reused for e in seen if isinstance(e, ev.EngineReady)] == [False, True]
    assert first.runs[0]["url"] == second.runs[0]["url"]
    for report in (first, second):
        (run,) = report.runs
        assert all(p["tokens_identical"] for p in run["prompts"]), run["prompts"]
        assert run["batch"]["formed"] is True and run["external"] is False
        assert {s["status"] for s in run["settings"]} <= {"verified", "not applicable"}
    assert second.runs[0]["batch"]["max_batch"] == 4
    # the session stopped its engine on exit
    meta = json.loads((Path(first.runs[0]["run_dir"]) / "meta.json").read_text())
    assert meta["stop"]["leftover_pids"] == []
