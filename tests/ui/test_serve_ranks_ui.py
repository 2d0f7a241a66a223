"""The serve dashboard by rank (issue 44): a DP=2 server's process tree (a row per
EngineCore_DPi and each Worker_*, in rank order), the patch ledger per rank, and the rank
that died first on the state panel, from a recorded snapshot made into a DP=2 one with
the ledger and first death tests/data/deaths/dp2-sigkill-enginecore_dp1 recorded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opsctl.collectors import deaths, ledger
from opsctl.collectors.processes import ProcessTree
from opsctl.serve.collect import from_dict
from opsctl.serve.view_app import build_serve_app
from opsctl.serve.view_panels import LedgerPanel, ProcessPanel, StatePanel

FIXTURE = Path(__file__).parent / "fixtures" / "serve_snapshots.jsonl"
RUN = Path(__file__).resolve().parents[1] / "data" / "deaths" / "dp2-sigkill-enginecore_dp1"


def dp2_snapshot():
    """The recorded ready snapshot with the DP=2 run's processes, ledger and first death."""
    base = from_dict(json.loads(FIXTURE.read_text().splitlines()[-1]))
    proto = base.tree.processes[0]
    records = ledger.read_records(RUN)
    ranked = ledger.with_ranks(records)
    procs = tuple(
        dataclasses.replace(proto, pid=r["pid"], ppid=r["ppid"], role=r["rank"])
        for r in reversed(ranked)  # the collector's order is the tree's: shown as given
    )
    death = deaths.of_run(RUN)
    assert death is not None
    return dataclasses.replace(
        base,
        state="dead",
        tree=ProcessTree(ranked[0]["pid"], base.tree.taken_at, procs),
        ledger=ledger.entries(records),
        first_death=death.lines(),
    )


async def _shown(pilot, app) -> None:
    import time

    deadline = time.monotonic() + 30
    while app.polls < 1:
        assert time.monotonic() < deadline, "no poll shown"
        await pilot.pause(0.02)


@pytest.mark.anyio
async def test_dashboard_rows_by_rank_and_the_first_death():
    snap = dp2_snapshot()
    app = build_serve_app(lambda: snap, interval=3600, clock=False)
    async with app.run_test(size=(160, 60)) as pilot:
        await _shown(pilot, app)
        detail = str(app.query_one(StatePanel).query_one("#state-detail").render())
        assert "first rank death: EngineCore_DP1 (pid 9274) died first: killed by SIGKILL" in detail
        assert "last lines of EngineCore_DP1 (pid 9274):" in detail
        table = app.query_one(ProcessPanel).query_one("DataTable")
        roles = [str(table.get_row_at(i)[1]).strip() for i in range(table.row_count - 1)]
        assert set(roles) == {"APIServer", "EngineCore_DP0", "Worker_DP0", "EngineCore_DP1",
                              "Worker_DP1"}  # fmt: skip
        ranks = app.query_one(LedgerPanel).query_one("DataTable")
        seen = [str(ranks.get_row_at(i)[1]) for i in range(ranks.row_count)]
        assert list(dict.fromkeys(seen)) == [
            "APIServer",
            "EngineCore_DP0",
            "Worker_DP0",
            "EngineCore_DP1",
            "Worker_DP1",
        ]  # the ledger per rank, in rank order
