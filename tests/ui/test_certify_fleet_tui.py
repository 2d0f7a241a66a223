"""`opsctl certify URL URL ... --tui`: the fleet's events in the live panel (DiagApp, the
same ``call(progress)`` the plain CLI runs): the fleet table (one row per target, its
verdict and state), each target's lines in the log, the fleet's verdict."""

from __future__ import annotations

import time

import pytest

from opsctl.checks import certify
from opsctl.checks import certify_fleet as fleet
from opsctl.checks.certify_fleet import FLEET_COLUMNS
from opsctl.domain.certify_fleet import FleetTarget
from opsctl.ui.diag_app import DiagApp
from opsctl.ui.panels.diag import DiagPanel
from tests.standins.completions import Behaviour, completions_server
from tests.standins.fleet import slow_server


@pytest.mark.anyio
async def test_fleet_table_and_per_target_lines_in_the_live_panel():
    with completions_server(Behaviour()) as (a, _), slow_server(3.0) as slow:
        targets = [FleetTarget("a", a), FleetTarget("slow", slow)]  # slow: past its deadline
        options = fleet.Options(certify.Options(checks=("liveness",), timeout=5.0))
        app = DiagApp("certify", lambda progress: fleet.run(targets, options, progress))
        async with app.run_test(size=(160, 40)) as pilot:
            until = time.monotonic() + 60  # a deadline, not a poll count (the loop is async)
            while not app.done.is_set():
                assert time.monotonic() < until, "the fleet did not finish within 60 s"
                await pilot.pause(0.1)
            await pilot.pause()
            panel = app.query_one(DiagPanel)
            assert panel.last["columns"] == list(FLEET_COLUMNS)
            rows = {r[0]: r for r in panel.last["rows"]}
            assert (rows["a"][2], rows["a"][3]) == ("PASS", "ran"), rows
            assert (rows["slow"][2], rows["slow"][3]) == ("FAIL", "deadline")
            assert panel.last["verdict"] == "fail"
    assert app.error is None and app.report.exit_code == 1
