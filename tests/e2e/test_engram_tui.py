"""`engram inspect --tui`: the library call's progress events drive the reusable diag
panel (DiagApp), as ``opsctl.ui.progress.run_with_progress`` runs it."""

from __future__ import annotations

import time

import pytest
from engram_tables import shared_table, unique_prefix

from opsctl.suite.engram import run_tables as engram
from opsctl.ui.diag_app import DiagApp
from opsctl.ui.panels.diag import DiagPanel


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_inspect_events_in_the_dashboard_panel():
    prefix = unique_prefix("tui")
    opts = engram.InspectOptions(verify="full", prefix=prefix)
    with shared_table(prefix, mappers=2) as t:
        app = DiagApp("engram inspect", lambda progress: engram.inspect(opts, progress))
        async with app.run_test(size=(160, 40)) as pilot:
            deadline = time.monotonic() + 60  # a full verify of the table, on a loaded machine
            while not app.done.is_set():
                assert time.monotonic() < deadline, "engram inspect did not finish"
                await pilot.pause(0.02)
            await pilot.pause(0.1)
            panel = app.query_one(DiagPanel)
            assert panel.last["verdict"] == "pass" and panel.last["phase"] == "done"
            assert panel.last["rows"][0][0] == t.name
            assert panel.last["rows"][0][-1].startswith("constant (full")
            assert "table(s); /dev/shm free" in panel.last["summary"]
            assert panel._columns == engram.COLUMNS
            await pilot.press("q")
        assert app.error is None
        assert app.report.to_dict()["tables"][0]["verify"]["status"] == "constant"
