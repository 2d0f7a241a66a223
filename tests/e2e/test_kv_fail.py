"""`opsctl diag kv-fail` end to end on CPU, real engines with real seeded weights.

Engine starts in this module: 5 (one per diag run, plus one hybrid engine without
any connector for the no-connector baseline).
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
    return diag("--model", "tiny-llama", "--policy", "recompute")


@pytest.fixture(scope="module")
def llama_fail():
    return diag("--model", "tiny-llama", "--policy", "fail", "--blocks", "0", "--seed", "3")


@pytest.fixture(scope="module")
def hybrid():
    return diag("--model", "tiny-hybrid", "--policy", "recompute")


@pytest.fixture(scope="module")
def hybrid_no_patch():
    return diag("--model", "tiny-hybrid", "--no-patch")


def test_llama_recompute_truncates_and_matches(llama_recompute):
    rc, doc, err = llama_recompute
    assert rc == 0, err[-2000:]
    assert doc["schema"] == "opsctl.diag.kv-fail/1"
    assert len(doc["kv_cache_groups"]) == 1
    assert doc["patch"]["status"] == "applied"  # applied, but single group takes upstream's path
    assert doc["failures_injected"] == 2 and doc["requests_affected"] == 2
    # single group: only the failed last block (32 tokens) is recomputed per request
    assert doc["tokens_recomputed"] == 2 * 32
    assert doc["tokens_recomputed_by_patch"] == 0
    assert doc["requests_failed"] == 0 and doc["engine_alive"] and doc["outputs_identical"]
    assert all(r["roundtrip"]["identical"] and r["inject"]["identical"] for r in doc["requests"])
    assert any(r["sensitivity"] and not r["sensitivity"]["identical"] for r in doc["requests"])


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
    rc, doc, err = hybrid
    assert rc == 0, err[-2000:]
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

    from opsctl.commands.diag.kv_fail_run import _complete
    from opsctl.domain import kv_fail as dom
    from tests.conftest import running_engine

    _rc, doc, _err = hybrid
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
        plain = [_complete(client, server.url, "tiny-hybrid", p, 16, 120) for p in doc["prompts"]]
    for i, (b, p) in enumerate(zip(baseline, plain, strict=True)):
        c = dom.compare(b, p)
        assert c.identical, (i, c)


def test_hybrid_without_patch_reports_engine_death(hybrid_no_patch):
    rc, doc, err = hybrid_no_patch
    assert rc == 1
    assert doc["patch"]["status"] == "skipped"
    assert doc["engine_alive"] is False and doc["died_in_phase"] == "inject"
    assert doc["verdict"] == "fail"
    assert any(
        "RuntimeError" in line or "EngineDead" in line or "KV cache groups" in line
        for line in doc["engine_death"] or []
    )
    assert "engine died" in err
