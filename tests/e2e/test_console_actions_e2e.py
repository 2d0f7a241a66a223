"""The console's actions on a real engine (one engine start): from the console start
tiny-llama (real weights), run `diag invariance` on it from command mode, see the
verdict on its row and in the drill-in, stop it from the console, and nothing of it is
left running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest
from textual.widgets import Input

from opsctl import paths
from opsctl.console import discovery
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.view_app import DetailScreen, build_console_app
from opsctl.console.view_checks import ChecksScreen
from opsctl.console.view_modals import ConfirmScreen, StartServerScreen
from opsctl.ui.panels.diag import DiagPanel
from tests.ui.test_console_actions import COL, command, select, wait_for

pytestmark = pytest.mark.engine


def ours_only():
    """Runs this test process owns (other runs in the shared runs directory are not ours)."""
    found = discovery.discover_runs(paths.runs_dir())
    out = []
    for t in found:
        try:
            meta = json.loads((Path(t.run_dir) / "meta.json").read_text())
        except (OSError, ValueError, TypeError):
            continue
        if meta.get("owner_pid") == os.getpid():
            out.append(t)
    return out


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_start_check_verdict_on_row_and_stop_from_the_console():
    settings = Settings(interval_s=0.5, stall_window_s=10.0)
    src = DirectScrapeSource([], discover=True, discover_fn=ours_only, settings=settings)
    src.start()
    app = build_console_app(src, interval=0.5)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, StartServerScreen))
            app.screen.query_one("#weights", Input).value = "real"
            await pilot.click("#start")
            await wait_for(pilot, lambda: app.servers.managed, what="start")
            m = app.servers.managed[0]
            await wait_for(pilot, lambda: m.state in ("ready", "failed"), timeout=1800,
                           what="tiny-llama healthy (queued on the engine lock)")  # fmt: skip
            assert m.state == "ready", m.error
            server = m.server
            url = m.url
            await wait_for(pilot, lambda: url in app.table.cells
                           and app.table.cells[url][1] == "ready", timeout=60, what="row")  # fmt: skip
            assert app.table.cells[url][2] == "tiny-llama"
            await select(pilot, app, url)
            await command(pilot, "diag invariance")
            await wait_for(pilot, lambda: isinstance(app.screen, ChecksScreen))
            job = app.jobs.jobs[0]
            await wait_for(pilot, lambda: not job.running, timeout=600, what="invariance",
                           show=lambda: job.phase)  # fmt: skip
            assert job.state == "done", job.error
            assert job.verdict in ("pass", "fail")
            print(f"diag invariance from the console: {job.verdict} ({job.finding})")
            assert job.report.to_dict()["runs"][0]["prompts"]  # it really ran
            # the final snapshot reaches the panel as a message after the job ended
            await wait_for(pilot, lambda: app.screen.query_one(DiagPanel).last.get("verdict")
                           == job.verdict, timeout=30, what="the verdict in the panel")  # fmt: skip
            await pilot.press("escape")
            want = f"invariance: {job.verdict.upper()}"
            await wait_for(pilot, lambda: app.table.cells[url][COL].startswith(want),
                           what=f"{want} on the row")  # fmt: skip
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
            block = app.screen.query_one("#d-actions")
            await wait_for(pilot, lambda: want in str(block.render()))
            await pilot.press("escape")
            # stop it from the console
            pids = list(server.known_pids)
            assert len(pids) >= 2  # API server and EngineCore at least
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: m.state == "stopped", timeout=120, what="stopped")
            report = server.stop_report
            assert report is not None and report.leftover_pids == []
            left = [p for p in pids if psutil.pid_exists(p) and server._living([p])]
            assert left == [], f"processes left: {left}"
            assert json.loads((server.run_dir / "meta.json").read_text())["stopped_at"]
    finally:
        src.close()
        app.servers.close()
