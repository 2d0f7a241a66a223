"""`opsctl diag invariance --model tiny-llama --mode both`: opsctl starts the engine
itself twice (vLLM's default execution mode on this platform, then --enforce-eager),
with the isolating settings, and shows both verdicts side by side. Two engine starts.

Verdicts are whatever the platform gives (a bitwise logprob difference on CPU is a
finding, not a bug): the test checks tokens, that the settings and the mode reached each
engine, that the batch formed, and that the exit code follows the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

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
