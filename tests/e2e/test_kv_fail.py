"""`opsctl diag kv-fail` end to end on CPU, real engines with real seeded weights: three
runs through the CLI (JSON, exit codes, stderr) and one through the library entry point
(:func:`opsctl.suite.kv_fail.run.run`: typed events, the typed report, its terminal view).

Engine starts in this module: 6 (one per diag run, plus one hybrid engine without
any connector for the no-connector baseline). The tiny-llama recompute run sweeps seeds 0-2
and the request-route run seeds 0 and 2, each on its one engine (``--seeds``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

OPSCTL = [sys.executable, "-m", "opsctl"]
# vLLM's CPU platform reserves one more core when a KV connector is configured; on a
# small machine that changes the worker's OpenMP thread count and with it the float
# reduction order (logprobs then differ by ~1e-6 from an engine without connector).
# Pin the reservation so the connector engine and the plain engine run alike.
SAME_THREADS = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}


def diag(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [*OPSCTL, "diag", "kv-fail", "--json", *args],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, **SAME_THREADS},
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(
            f"no JSON on stdout (rc {proc.returncode}); stderr tail:\n{proc.stderr[-3000:]}"
        )
    return proc.returncode, doc, proc.stderr


@pytest.fixture(scope="module")
def llama_recompute():
    """A sweep of three seeds on the one engine this run starts."""
    return diag("--model", "tiny-llama", "--policy", "recompute", "--seeds", "0-2")


@pytest.fixture(scope="module")
def llama_fail():
    return diag("--model", "tiny-llama", "--policy", "fail", "--blocks", "0", "--seed", "3")


@pytest.fixture(scope="module")
def hybrid():
    """The library call, in this process: (report, every progress event in order)."""
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.kv_fail import run as kv_fail
    from opsctl.suite.kv_fail.judge import Settings

    events: list = []
    spec = EngineSpec(model="tiny-hybrid", env=tuple(SAME_THREADS.items()), timeout=600)
    report = kv_fail.run(spec, kv_fail.Options(Settings(policy="recompute")), events.append)
    return report, events


@pytest.fixture(scope="module")
def hybrid_no_patch():
    return diag("--model", "tiny-hybrid", "--no-patch")


@pytest.fixture(scope="module")
def hybrid_requests_no_patch():
    """Upstream's supported route for several KV cache groups: failed requests."""
    return diag("--model", "tiny-hybrid", "--no-patch", "--route", "requests", "--seeds", "0,2")


def test_hybrid_request_route_recovers_without_any_opsctl_patch(hybrid_requests_no_patch):
    """vLLM 0.32 refuses failed blocks on two groups (the engine dies: the test below)
    but recomputes a request reported failed (failed_recving) from token 0, unpatched."""
    from pathlib import Path

    rc, doc, err = hybrid_requests_no_patch
    assert rc == 0, err[-2000:]
    assert doc["injection"]["route"] == "requests"
    assert [(s["seed"], s["verdict"]) for s in doc["seeds"]] == [(0, "pass"), (2, "pass")]
    assert doc["totals"]["engine_starts"] == 1
    assert {p["status"] for p in doc["recovery_patches"]} == {"skipped"}
    assert len(doc["kv_cache_groups"]) == 2
    assert doc["failures_injected"] >= 2 and doc["requests_affected"] == 2
    assert doc["engine_alive"] and doc["outputs_identical"] and doc["requests_failed"] == 0
    assert any(r["sensitivity"] and not r["sensitivity"]["identical"] for r in doc["requests"])
    events = Path(doc["run_dir"]) / "events"
    # the connector loaded asynchronously and never offered the failed requests again
    loads = [json.loads(x) for x in (events / "kv_transfers.jsonl").read_text().splitlines()]
    assert {e.get("route") for e in loads if e["op"] == "load"} == {"requests"}
    failed = {
        e["request_id"]
        for e in loads
        if e["op"] == "load" and e["injected"] and e["epoch"] == "inject"
    }
    conn = [json.loads(x) for x in (events / "kv_connector.jsonl").read_text().splitlines()]
    refused = {e["request_id"] for e in conn if e.get("offered") == 0}
    assert len(failed) == 2 * len(doc["seeds"]) and failed <= refused  # 2 per seed, one engine


def test_llama_recompute_truncates_and_matches(llama_recompute):
    rc, doc, err = llama_recompute
    assert rc == 0, err[-2000:]
    assert doc["schema"] == "opsctl.diag.kv-fail/3"
    assert doc["test_knobs"] == {} and doc["warnings"] == [] and doc["duration_s"] > 0
    assert len(doc["kv_cache_groups"]) == 1
    assert doc["patch"]["status"] == "applied"  # applied, but single group takes upstream's path
    assert doc["failures_injected"] == 2 and doc["requests_affected"] == 2
    # single group: only the failed last block (32 tokens) is recomputed per request
    assert doc["tokens_recomputed"] == 2 * 32
    assert doc["tokens_recomputed_by_patch"] == 0
    assert doc["requests_failed"] == 0 and doc["engine_alive"] and doc["outputs_identical"]
    assert all(r["roundtrip"]["identical"] and r["inject"]["identical"] for r in doc["requests"])
    assert any(r["sensitivity"] and not r["sensitivity"]["identical"] for r in doc["requests"])


def test_llama_sweep_runs_every_seed_on_one_engine(llama_recompute):
    """--seeds 0-2: three seeds, one engine start, a row per seed with its own workload."""
    rc, doc, err = llama_recompute
    assert rc == 0, err[-2000:]
    seeds = doc["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1, 2]
    assert all(s["verdict"] == "pass" and s["engine_start"] == 1 for s in seeds), seeds
    assert len({s["run_dir"] for s in seeds}) == 1  # one engine for the sweep
    t = doc["totals"]
    assert (t["seeds"], t["pass"], t["fail"], t["inconclusive"], t["engine_starts"]) == (
        3,
        3,
        0,
        0,
        1,
    )
    assert t["failures_injected"] == sum(s["failures_injected"] for s in seeds) == 3 * 2
    assert t["tokens_recomputed"] == 3 * 2 * 32 and t["max_noise_floor"] == 0.0
    # each seed its own targets; the top level is the last seed's run (all passed)
    assert doc["verdict_seed"] == 2 and doc["injection"]["seed"] == 2
    assert doc["injection"]["targets"] == seeds[2]["targets"]
    from opsctl.suite.kv_fail import judge as dom

    assert [s["targets"] for s in seeds] == [dom.choose_targets(4, k, None) for k in (0, 1, 2)]
    assert "seed 1: 4 requests" in err  # the per-seed progress lines
    assert all(f"seed {k} -> pass: injected 2 block(s)" in err for k in (0, 1, 2)), err[-3000:]


def test_llama_fail_fails_only_injected_requests(llama_fail):
    rc, doc, err = llama_fail
    assert rc == 0, err[-2000:]
    injected = {r["index"] for r in doc["requests"] if r["injected_blocks"]}
    failed = {r["index"] for r in doc["requests"] if r["failed"]}
    assert injected and failed == injected == set(doc["injection"]["targets"])
    assert doc["requests_failed"] == len(injected) and doc["engine_alive"]
    for r in doc["requests"]:
        if r["failed"]:
            assert r["finish_reason"] == "error" or r["error"]
        else:
            assert r["inject"]["identical"]
    assert doc["tokens_recomputed"] == 0


def test_hybrid_with_patch_survives_and_matches(hybrid):
    report, _events = hybrid
    doc = report.to_dict()
    assert report.verdict == "pass" and report.failures == [], doc["findings"]
    assert report.schema == "opsctl.diag.kv-fail/3" and doc["test_knobs"] == {}
    (seed,) = doc["seeds"]  # one seed: one row, the document is its run
    assert (seed["seed"], seed["verdict"], seed["engine_start"]) == (0, "pass", 1)
    assert doc["totals"]["engine_starts"] == 1 and doc["verdict_seed"] == 0
    assert [g["spec"] for g in doc["kv_cache_groups"]] == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert doc["patch"]["status"] == "applied"
    assert doc["engine_alive"] and doc["requests_failed"] == 0 and doc["outputs_identical"]
    assert doc["failures_injected"] == 2 * len(doc["injection"]["targets"])  # one per group
    # whole-request recompute: every loaded token of each affected request
    affected = [r for r in doc["requests"] if r["injected_blocks"]]
    assert doc["tokens_recomputed"] == sum((r["prompt_tokens"] - 1) // 32 * 32 for r in affected)
    assert doc["tokens_recomputed"] == doc["tokens_recomputed_by_patch"]
    assert doc["metrics_delta"]["vllm:num_preemptions_total"] == len(affected)


def test_hybrid_store_reload_equals_no_connector_run(hybrid):
    """The hybrid model's KV round-trips exactly: the reloaded outputs equal the
    baseline, and the baseline equals an engine without any connector."""
    import httpx

    from opsctl.suite.kv_fail import judge as dom
    from opsctl.suite.kv_fail.collect import complete
    from tests.conftest import running_engine

    doc = hybrid[0].to_dict()
    assert all(r["roundtrip"]["identical"] for r in doc["requests"])
    baseline = [
        dom.Output(True, o["finish_reason"], tuple(o["token_ids"]), tuple(o["logprobs"]))
        for o in doc["baseline"]
    ]
    args = ["--block-size", "32", "--no-enable-prefix-caching"]
    with (
        running_engine(
            "tiny-hybrid", extra_args=args, max_model_len=256, env=SAME_THREADS
        ) as server,
        httpx.Client() as client,
    ):
        plain = [complete(client, server.url, "tiny-hybrid", p, 16, 120) for p in doc["prompts"]]
    for i, (b, p) in enumerate(zip(baseline, plain, strict=True)):
        c = dom.compare(b, p)
        assert c.identical, (i, c)


def test_hybrid_library_call_reports_typed_events(hybrid):
    """What a console or certify sees while the check runs: the start, the engine, the
    four phases in order, every injection (reported in inject, silent in sensitivity)
    with its request, the patch's recoveries, no death, and the verdict last."""
    from opsctl.checks import events as ev
    from opsctl.suite.kv_fail import run as kv_fail

    report, events = hybrid
    doc = report.to_dict()
    assert isinstance(events[0], ev.Started) and events[0].title == "diag kv-fail"
    assert isinstance(events[-1], ev.Finished) and events[-1].verdict == "pass"
    assert len(events[-1].rows) == len(doc["requests"])
    kinds = [type(e) for e in events]
    assert kinds.index(ev.EngineStarting) < kinds.index(ev.EngineReady) < kinds.index(ev.Phase)
    phases = [e.name for e in events if isinstance(e, ev.Phase)]
    assert phases == ["store", "roundtrip", "inject", "sensitivity"]
    injected = [e for e in events if isinstance(e, kv_fail.Injected)]
    inject = [e for e in injected if e.injection.epoch == "inject"]
    silent = [e for e in injected if e.injection.epoch == "sensitivity"]
    targets = set(doc["injection"]["targets"])
    assert len(inject) == doc["failures_injected"] and all(e.injection.reported for e in inject)
    assert {e.request for e in inject} == targets
    assert {e.injection.group for e in inject} == {0, 1}  # one per KV cache group
    assert silent and not any(e.injection.reported for e in silent)
    assert {e.request for e in silent} == targets
    recovered = [e.recovery for e in events if isinstance(e, kv_fail.Recovered)]
    assert recovered and all(r.action == "recomputed" for r in recovered)
    assert sum(r.tokens for r in recovered) == doc["tokens_recomputed_by_patch"]
    assert not any(isinstance(e, kv_fail.EngineDied) for e in events)
    last_table = [e for e in events if isinstance(e, ev.Table)][-1]
    assert all(row[3] == "identical" for row in last_table.rows)  # round trip column


def test_hybrid_report_renders_for_the_terminal(hybrid):
    from rich.console import Console

    from opsctl.suite.kv_fail.view import render

    con = Console(record=True, width=200)
    render(con, hybrid[0].to_dict())
    text = con.export_text()
    assert "verdict: PASS" in text and "SlidingWindowSpec(window 32)" in text
    assert (
        "patches kv_hybrid_recompute applied, kv_async_inflight applied, kv_rewind_v2 applied"
        in text
    )


def assert_died_unpatched(doc: dict, err: str) -> None:
    """Every recovery patch off: the engine died in the inject phase, and the fail says so."""
    assert {p["status"] for p in doc["recovery_patches"]} == {"skipped"}  # all three off
    assert doc["engine_alive"] is False and doc["died_in_phase"] == "inject"
    assert doc["verdict"] == "fail"
    assert any(
        "RuntimeError" in line or "EngineDead" in line or "KV cache groups" in line
        for line in doc["engine_death"] or []
    )
    assert "engine died" in err


def test_hybrid_without_patch_reports_engine_death(hybrid_no_patch):
    rc, doc, err = hybrid_no_patch
    assert rc == 1
    assert doc["patch"]["status"] == "skipped"
    assert_died_unpatched(doc, err)
