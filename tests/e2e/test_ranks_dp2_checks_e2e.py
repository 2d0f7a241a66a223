"""The checks on a real DP=2 server (issue 44, item 6): the pooled `dp2` engine (tiny-llama,
two EngineCores behind one API server and a DPCoordinator), no start of its own.

vLLM spreads concurrent requests over its engines and /metrics carries every series once
per engine. On main `diag invariance URL` sent BS=N unpinned: vLLM split it over both
engines (two smaller batches) while the summed running gauge claimed one batch of N. Now
every request of the run goes to one engine (vLLM's X-data-parallel-rank header), which
the per-engine counters show; `certify URL` reports every check as it is."""

from __future__ import annotations

import re

import httpx
import pytest

from opsctl.collectors.ledger import read_records
from tests.e2e.test_ranks_tp2_checks_e2e import certified_as_is, invoke, judged_as_is

pytestmark = [pytest.mark.engine, pytest.mark.pool("dp2")]

TOKENS = re.compile(r'^vllm:generation_tokens_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)$', re.M)


@pytest.fixture(scope="module")
def engine(engine_pool):
    return engine_pool.engine("dp2")


def tokens_per_engine(url: str) -> dict[str, float]:
    """Each DP engine's generated-token counter."""
    return {e: float(v) for e, v in TOKENS.findall(httpx.get(f"{url}/metrics").text)}


def test_invariance_on_a_dp2_url_runs_in_one_engine(engine):
    before = tokens_per_engine(engine.url)
    assert sorted(before) == ["0", "1"]
    rc, doc, _err = invoke("diag", "invariance", engine.url, "--max-tokens", "8")
    after = tokens_per_engine(engine.url)
    (run,) = doc["runs"]
    judged_as_is(rc, run)
    assert any("every request went to engine 0" in w for w in run["warnings"]), run["warnings"]
    # BS=1 and BS=N, 8 prompts x 8 tokens each: all on engine 0, none on engine 1
    assert after["1"] == before["1"], (before, after)
    assert after["0"] - before["0"] >= 2 * 8 * 8, (before, after)
    assert run["batch"]["tokens"] == 8 * 8


def test_certify_url_on_dp2_reports_every_check(engine):
    rc, doc, err = invoke("certify", engine.url)
    roles = sorted(certified_as_is(rc, doc, err).values())
    # the patch ledger of every rank process: both EngineCores and their workers
    assert roles == ["api_server", "engine_core", "engine_core", "worker", "worker"], roles
    assert len(read_records(engine.run_dir)) >= len(roles)
