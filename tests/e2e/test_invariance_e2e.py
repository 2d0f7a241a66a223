"""`opsctl diag invariance` against one real vLLM CPU engine (tiny-llama, real seeded
weights), the session pool's ``invariance-nudge`` (tests/engine_pool.py; the library
calls of test_invariance_modes_e2e.py read from the same one): started with the diag's
own isolating settings, the batch probe, and a planted-divergence nudge that only
touches prompts containing "zebra" at output position 3 when they are batched with
others.

One engine start for: the main BS=1 vs BS=N comparison (tokens identical, logprob
verdict as measured, settings read back from the engine, the batch really formed), the
planted divergence caught at the right prompt and position, fail-closed on a request
error, an external server without an opsctl ledger, and the library entry point
(opsctl.suite.invariance.run.run) called directly with its typed events.
"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from opsctl.collectors.ledger import read_events
from opsctl.suite.invariance import run as check
from opsctl.suite.invariance.judge_engine import prompt_index
from opsctl.suite.invariance.run import DEFAULT_PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.pool("invariance-nudge")]

MARKER, NUDGE_POS = "zebra", 3
PLANTED_PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Hello world, this is a test of",
    "Once upon a time there was",
    "vLLM serves large language models",
    "The cat sat on the mat and",
    "a zebra walks into the engine",
    "Numbers: one two three four",
    "A batch of prompts walks into a",
]
PLANTED_INDEX = 5

runner = CliRunner()


@pytest.fixture(scope="module")
def engine(engine_pool):
    """Isolating settings, batch probe, 8 sequences, knob NUDGE=zebra:3 (the spec is
    engine_pool.SPECS["invariance-nudge"]; a knob only reaches an engine that way)."""
    live = engine_pool.engine("invariance-nudge")
    spec = engine_pool.session.starts[-1].spec
    assert dict(spec.knobs) == {knobs.NUDGE: f"{MARKER}:{NUDGE_POS}"} and spec.max_num_seqs == 8
    return live


def diag(*args: str):
    r = runner.invoke(app, ["diag", "invariance", *args, "--json"])
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r, doc


@pytest.fixture(scope="module")
def main_run(engine):
    return diag(engine.url, "--mode", "eager")


def test_main_comparison_tokens_identical_and_verdict_as_measured(engine, main_run):
    r, doc = main_run
    assert doc is not None, r.stderr
    assert doc["schema"] == "opsctl.diag.invariance/3"
    assert doc["comparison"] == "bitwise" and doc["batch_size"] == len(DEFAULT_PROMPTS)
    (run,) = doc["runs"]
    prompts = run["prompts"]
    assert len(prompts) == len(DEFAULT_PROMPTS)
    # real weights: tokens identical between BS=1 and BS=N for every prompt
    assert all(p["tokens_identical"] for p in prompts), prompts
    assert all(p["status"] != "error" for p in prompts), prompts
    # a divergence on CPU, if any, is a logprob difference, never a token
    for p in prompts:
        if p["status"] == "diverged":
            assert p["first_divergence"]["kind"] in ("logprob", "top_logprobs")
            assert p["first_divergence"]["token_alone"] == p["first_divergence"]["token_batched"]
    # verdict and exit code follow what was measured, bitwise
    all_identical = all(p["status"] == "identical" for p in prompts)
    assert run["verdict"] == doc["verdict"] == ("pass" if all_identical else "fail")
    assert r.exit_code == (0 if all_identical else 1), r.stderr
    largest = run["summary"]["largest_diff"]
    assert largest is not None and largest < 1e-3  # CPU noise, not a broken engine
    # report: platform from vLLM's current_platform, vLLM version, execution mode
    assert run["platform"] == "cpu"
    assert run["vllm_version"] == httpx.get(f"{engine.url}/version").json()["version"]
    assert run["execution"] == {"enforce_eager": True, "compilation_mode": "NONE"}
    assert run["run_dir"] == str(engine.run_dir)


def test_isolating_settings_reach_the_engine(engine, main_run):
    _, doc = main_run
    settings = {s["name"]: s for s in doc["runs"][0]["settings"]}
    assert settings["prefix caching"]["status"] == "verified"
    assert settings["prefix caching"]["seen"] == "False"
    # text-only model: vLLM accepts --mm-processor-cache-gb 0 but has no multimodal config
    assert settings["mm processor cache"]["status"] == "not applicable"
    assert settings["VLLM_USE_FLASHINFER_SAMPLER"]["status"] == "verified"
    assert settings["execution mode"]["status"] == "verified"
    assert settings["greedy (temperature 0)"]["status"] == "verified"
    assert settings["ignore_eos"]["status"] == "verified"
    # and the engine's own records say so
    info = read_events(engine.run_dir, "engine_info")[-1]
    assert info["enable_prefix_caching"] is False and info["mm_processor_cache_gb"] is None
    # ... in the process that samples (the EngineCore: check engines run the model there)
    events = read_events(engine.run_dir, "batch")
    samplers = {e["pid"] for e in events if e.get("event") == "step"}
    inits = [e for e in events if e.get("event") == "init" and e["pid"] in samplers]
    assert inits and all(e["role"] == "engine_core" for e in inits), events[:3]
    assert all(e["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" for e in inits)


def test_the_batch_really_formed(engine, main_run):
    _, doc = main_run
    batch = doc["runs"][0]["batch"]
    assert batch["source"] == "batch probe"
    assert batch["max_batch"] == len(DEFAULT_PROMPTS) and batch["formed"] is True
    assert batch["alone"] == [] and batch["via"] == "list"
    assert batch["per_prompt"] == {
        str(i): len(DEFAULT_PROMPTS) for i in range(len(DEFAULT_PROMPTS))
    }
    steps = [e for e in read_events(engine.run_dir, "batch") if e.get("event") == "step"]

    def most_together(tag):
        return max(sum(prompt_index(r, tag) is not None for r in s["req_ids"]) for s in steps)

    # the judged attempt's tag (on a busy host BS=N may be sent again: batch_attempts)
    judged = f"{doc['request_tag']}-eager-bs{len(DEFAULT_PROMPTS)}"
    judged += f"r{batch['attempts']}" if batch["attempts"] > 1 else ""
    assert most_together(judged) == len(DEFAULT_PROMPTS)
    # BS=1 requests were never sampled together, nor with anything else
    assert most_together(f"{doc['request_tag']}-eager-bs1") == 1
    assert batch["bs1_max_shared"] == 1


def test_planted_divergence_caught_at_the_right_prompt_and_position(engine, tmp_path):
    f = tmp_path / "prompts.json"
    f.write_text(json.dumps(PLANTED_PROMPTS))
    r, doc = diag(engine.url, "--prompts", str(f), "--atol", "1e-4")
    assert r.exit_code == 1, r.stderr
    assert doc["verdict"] == "fail" and doc["comparison"] == "atol=0.0001"
    prompts = doc["runs"][0]["prompts"]
    bad = [p for p in prompts if p["status"] not in ("identical", "within_atol")]
    assert [p["index"] for p in bad] == [PLANTED_INDEX], prompts
    div = bad[0]["first_divergence"]
    assert div["position"] == NUDGE_POS and div["kind"] == "logprob"
    assert div["token_alone"] == div["token_batched"]  # the nudge raises the top logit only
    assert div["diff"] > 1e-3
    assert div["diff"] == pytest.approx(abs(div["logprob_alone"] - div["logprob_batched"]))
    assert f"prompt {PLANTED_INDEX}: first divergence at position {NUDGE_POS}" in " ".join(
        doc["reasons"]
    )
    assert "TEST NUDGE" in " ".join(doc["runs"][0]["warnings"])
    assert doc["test_knobs"] == {knobs.NUDGE: f"{MARKER}:{NUDGE_POS}"}  # from the ledger
    assert doc["warnings"][0].startswith("TEST KNOBS active")
    # the engine nudged exactly that request, batched, at that position
    nudges = [e for e in read_events(engine.run_dir, "batch") if e.get("event") == "nudge"]
    attempts = doc["runs"][0]["batch"]["attempts"]  # the judged one's tag
    tag = f"{doc['request_tag']}-url-bs{len(PLANTED_PROMPTS)}" + (
        f"r{attempts}" if attempts > 1 else ""
    )
    ours = [e for e in nudges if prompt_index(e["req_id"], tag) is not None]
    assert len(ours) == 1 and ours[0]["position"] == NUDGE_POS and ours[0]["num_reqs"] > 1
    assert prompt_index(ours[0]["req_id"], tag) == PLANTED_INDEX


def test_request_error_is_a_failure_with_its_reason(engine):
    # the server allows 20 logprobs: asking 25 makes every request fail -> fail closed
    r, doc = diag(engine.url, "--logprobs", "25", "--max-tokens", "4")
    assert r.exit_code == 1
    prompts = doc["runs"][0]["prompts"]
    assert all(p["status"] == "error" for p in prompts)
    assert "max allowed: 20" in prompts[0]["reason"]
    assert doc["verdict"] == "fail" and "request error" in r.stderr


def test_external_server_without_ledger_reports_what_it_could_not_enforce(
    engine, tmp_path, monkeypatch
):
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path))  # no run directory knows this URL
    r, doc = diag(engine.url, "--max-tokens", "4")
    run = doc["runs"][0]
    assert run["run_dir"] is None and run["platform"] is None and run["platform_note"]
    status = {s["name"]: s["status"] for s in run["settings"]}
    assert status["prefix caching"] == status["mm processor cache"] == "not verified"
    assert status["VLLM_USE_FLASHINFER_SAMPLER"] == "not verified"
    assert status["greedy (temperature 0)"] == "verified"  # checked in the responses
    assert any("could not enforce/verify" in w and "prefix caching" in w for w in run["warnings"])
    # no batch probe records for this URL: the evidence comes from /metrics counters, which
    # a short batch cannot slip past (a sampled gauge could); ignore_eos -> exact tokens
    batch = run["batch"]
    assert batch["source"] == "metrics (generated tokens per engine step)", batch
    assert batch["tokens"] == 4 * len(DEFAULT_PROMPTS)
    assert 0 < batch["steps"] < batch["tokens"] and batch["formed"] is True
    assert r.exit_code == (0 if run["verdict"] == "pass" else 1)


def test_library_call_with_typed_events(engine):
    seen: list[ev.Event] = []
    options = check.Options(mode="eager", max_tokens=4, atol=1e-3)
    report = check.run(UrlTarget(engine.url), options, seen.append)
    assert seen[0] == ev.Started(
        "diag invariance", "BS=1 vs BS=8: 8 prompts x 4 tokens, atol=0.001"
    )
    assert seen[-1] == ev.Finished(report.verdict, f"eager: {report.verdict}")
    # the engine's knob is said while it runs; no default prompt carries the nudge marker
    assert any(isinstance(e, ev.Alert) and "TEST KNOBS" in e.text for e in seen)
    assert report.verdict == "pass" and not any(isinstance(e, ev.CaseResult) for e in seen)
    table = [e for e in seen if isinstance(e, ev.Table)][-1]
    assert len(table.rows) == 8 and {r[3] for r in table.rows} <= {"identical", "within_atol"}
    assert ev.Phase("eager: BS=8: prompts sent together", 8, 8) in seen
    (run,) = report.runs
    assert run["run_dir"] == str(engine.run_dir) and run["batch"]["formed"] is True
    assert report.to_dict()["schema"] == "opsctl.diag.invariance/3"


def test_a_sweep_on_the_one_engine_is_calibrated_per_seed(engine):
    """``--seeds 0-2``: three seeded prompt sets on this one engine (no start of its own),
    each run calibrated on it: CPU float32 is bitwise BS=1 vs BS=1 (floor 0), so the
    comparison stays bitwise and the planted probes stand infinitely above it."""
    r, doc = diag(engine.url, "--mode", "eager", "--max-tokens", "8", "--seeds", "0-2")
    assert doc is not None, r.stderr
    assert doc["seeds"] == [0, 1, 2] and [x["seed"] for x in doc["runs"]] == [0, 1, 2]
    prompts = [[p["prompt"] for p in x["prompts"]] for x in doc["runs"]]
    assert len({tuple(p) for p in prompts}) == 3  # a prompt set of its own per seed
    assert all(MARKER not in p for ps in prompts for p in ps)  # the nudge never applies
    for run in doc["runs"]:
        c = run["calibration"]
        assert c["floor"] == 0.0 and c["bitwise"] and c["floor_runs"] == len(DEFAULT_PROMPTS)
        assert c["sensitivity"] > 0 and c["conclusive"] and c["probes"] >= 1
        assert run["verdict"] == "pass", run["summary"]["reasons"]
    assert doc["totals"] == {"pass": 3, "fail": 0, "inconclusive": 0}
    assert doc["verdict"] == "pass" and r.exit_code == 0, r.stderr
    # the engine served them all: one run directory, this engine's
    assert {x["run_dir"] for x in doc["runs"]} == {str(engine.run_dir)}
