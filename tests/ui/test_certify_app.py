"""`opsctl certify --tui`: the CertifyApp runs a certification (a stand-in server, so no
engine) and shows the checks as a live list, each check's own panel with its events;
selecting a row shows that check's panel, ``f`` follows the running check again."""

from __future__ import annotations

import pytest
from textual.widgets import ContentSwitcher, DataTable

from opsctl.checks import certify
from opsctl.checks.target import UrlTarget
from opsctl.ui.certify_app import CertifyApp
from opsctl.ui.panels.diag import DiagPanel
from tests.standins.completions import Behaviour, completions_server


@pytest.mark.anyio
async def test_live_list_and_per_check_panels(home):
    with completions_server(Behaviour(diverge=("fox", 3, 0.01))) as (url, _):
        options = certify.Options(checks=("liveness", "invariance"))
        app = CertifyApp(lambda progress: certify.run(UrlTarget(url), options, progress))
        async with app.run_test(size=(140, 40)) as pilot:
            while not app.done.is_set():
                await pilot.pause(0.1)
            await pilot.pause()
            table = app.query_one("#checks", DataTable)
            verdicts = {str(key.value): table.get_cell(key, "verdict") for key in table.rows}
            assert verdicts["liveness"] == "pass" and verdicts["invariance"] == "fail"
            assert verdicts["kv-fail"] == "skipped" and verdicts["certify"] == "fail"
            # following: the last check that ran is on screen
            switcher = app.query_one("#panels", ContentSwitcher)
            assert switcher.current == "panel-invariance"
            inv = app.query_one("#panel-invariance", DiagPanel)
            assert inv.last["verdict"] == "fail"
            assert any(r[1] == "0" and r[3] == "diverged" for r in inv.last["rows"]), inv.last[
                "rows"
            ]
            live = app.query_one("#panel-liveness", DiagPanel)
            assert live.last["verdict"] == "pass"
            overall = app.query_one("#panel-certify", DiagPanel)
            assert overall.last["columns"] == ["check", "verdict", "time", "first finding"]
            # Enter on a row shows that check's panel and stops following
            table.focus()
            table.move_cursor(row=1)
            await pilot.press("enter")
            await pilot.pause()
            assert switcher.current == "panel-liveness" and not app.following
            await pilot.press("f")
            assert app.following
            await pilot.press("q")
    assert app.report is not None and app.report.verdict == "fail"
    assert app.error is None
