"""Every serve-side view names every rank of a real DP=2 server (issue 44, item 2): the
process tree, the patch ledger per rank (from the titles vLLM sets after the plugin
loaded), ``runs bundle``'s process list, ``console --once --json``'s pids and discovery
as a plain vLLM process. Read-only, on the pooled ``dp2`` engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import rank_views

pytestmark = [pytest.mark.engine, pytest.mark.pool("dp2")]

RANKS = [
    "APIServer",
    "DPCoordinator",
    "EngineCore_DP0",
    "Worker_DP0",
    "EngineCore_DP1",
    "Worker_DP1",
]


@pytest.fixture(scope="module")
def engine(engine_pool):
    return engine_pool.engine("dp2")


def test_tree_and_ledger_name_every_dp_rank(engine):
    rank_views.check_tree(engine.server.pid, RANKS)
    rank_views.check_ledger(Path(engine.run_dir), RANKS)


def test_bundle_and_console_name_every_dp_rank(engine, tmp_path):
    rank_views.check_bundle(Path(engine.run_dir), RANKS, tmp_path)
    rank_views.check_console(engine.url, engine.server.pid, RANKS)
