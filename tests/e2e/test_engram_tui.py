"""`engram inspect --tui`: the same pipeline drives the reusable diag panel (DiagApp)."""

from __future__ import annotations

import time

import pytest
from engram_tables import shared_table, unique_prefix

from opsctl.commands.engram import COLUMNS, inspect_pipeline
from opsctl.ui.diag_app import DiagApp
from opsctl.ui.panels.diag import DiagPanel


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_inspect_pipeline_in_the_dashboard_panel():
    prefix = unique_prefix("tui")
    with shared_table(prefix, mappers=2) as t:
        app = DiagApp("engram inspect", lambda emit: inspect_pipeline(emit, None, "full", prefix))
        async with app.run_test(size=(160, 40)) as pilot:
            deadline = time.monotonic() + 60  # a full verify of the table, on a loaded machine
            while not app.done.is_set():
                assert time.monotonic() < deadline, "inspect pipeline did not finish"
                await pilot.pause(0.02)
            await pilot.pause(0.1)
            panel = app.query_one(DiagPanel)
            assert panel.last["verdict"] == "pass"
            assert panel.last["rows"][0][0] == t.name
            assert panel._columns == tuple(COLUMNS)
            await pilot.press("q")
        assert app.error is None and app.report["tables"][0]["verify"]["status"] == "constant"
