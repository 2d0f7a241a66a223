"""`opsctl diag invariance --model tiny-llama --mode both`: opsctl starts the engine
itself twice (vLLM's default execution mode on this platform, then --enforce-eager),
with the isolating settings, and shows both verdicts side by side. Two engine starts;
two library calls share one engine through an EngineSession: the session pool's, whose
``invariance-nudge`` engine test_invariance_e2e.py started (no start of their own when
the two modules run together, as the suite orders them).

Verdicts are whatever the platform gives (a bitwise logprob difference on CPU is a
finding, not a bug): the test checks tokens, that the settings and the mode reached each
engine, that the batch formed, and that the exit code follows the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec
from opsctl.cli import app
from opsctl.suite.invariance import run as check
from tests.expect import CPU_SETTINGS, settings_status

pytestmark = pytest.mark.engine

# the spec of the pooled "invariance-nudge" engine, as a check's caller writes it
NUDGED = EngineSpec(knobs=((knobs.NUDGE, "zebra:3"),))


@pytest.mark.pool("invariance-nudge")
def test_two_calls_in_one_session_share_the_isolated_engine(engine_pool):
    """Two library calls given one EngineSession share its engine. The session is the
    suite's pool (tests/engine_pool.py), which holds the very engine these calls ask for
    (test_invariance_e2e.py reads from it too): the isolated eager tiny-llama with the
    zebra nudge, which no default prompt triggers. First in the module: the pooled engine
    is still alive from test_invariance_e2e.py, and `both` below needs the memory."""
    seen: list[ev.Event] = []
    session = engine_pool.session_for("invariance-nudge")
    started = len(session.starts)
    first = check.run(NUDGED, check.Options(mode="eager", max_tokens=4), seen.append, session)
    options = check.Options(mode="eager", max_tokens=4, batch_size=4)
    second = check.run(NUDGED, options, seen.append, session)
    assert len(session.starts) == started  # the session's engine served both calls
    start = session.starts[-1]
    assert start.served[-2:] == ["invariance-eager", "invariance-eager"]
    assert start.spec.probes >= {"batch"} and start.spec.enforce_eager is True
    assert [e.reused for e in seen if isinstance(e, ev.EngineReady)] == [True, True]
    assert first.runs[0]["url"] == second.runs[0]["url"] == start.live.url
    for report in (first, second):
        (run,) = report.runs
        assert all(p["tokens_identical"] for p in run["prompts"]), run["prompts"]
        assert run["batch"]["formed"] is True and run["external"] is False
        assert {s["status"] for s in run["settings"]} <= {"verified", "not applicable"}
    assert second.runs[0]["batch"]["max_batch"] == 4
    # the session stops its engine on close (the pool's last user of it: closed here)
    engine_pool.release()
    meta = json.loads((Path(first.runs[0]["run_dir"]) / "meta.json").read_text())
    assert meta["stop"]["leftover_pids"] == []


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
        assert settings_status(run) == CPU_SETTINGS
        identical = all(p["status"] == "identical" for p in run["prompts"])
        assert run["verdict"] == ("pass" if identical else "fail")
    overall = all(run["verdict"] == "pass" for run in runs.values())
    assert doc["verdict"] == ("pass" if overall else "fail")
    assert r.exit_code == (0 if overall else 1), r.stderr
    # the engines are gone: stopped by the diag itself
    for run in runs.values():
        meta = json.loads((Path(run["run_dir"]) / "meta.json").read_text())
        assert meta["stop"]["leftover_pids"] == []
