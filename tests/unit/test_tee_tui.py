"""The console TUI with ``--tee`` and ``--log`` (the app from the CLI's factory, the
direct source over a stand-in vLLM, wrapped by opsctl.console.taps.tapped as the command
wraps it): the row's running cell counts the tee's requests in flight, the drill-in
lists the requests and the tailed log (a real vLLM 0.32 death log)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.taps import tapped
from opsctl.console.view_app import DetailScreen, build_console_app
from opsctl.engine.server import free_port
from tests.standins.vllm_server import StandInFleet

LOG = Path(__file__).resolve().parents[1] / "data/serverlogs/vllm-0.32-no-such-arch-death.log"


async def wait_for(pilot, cond, timeout: float = 30.0, what: str = "the console") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


@pytest.mark.anyio
async def test_row_and_drill_in_show_tee_requests_and_the_log(tmp_path):
    log = tmp_path / "server.log"
    shutil.copy(LOG, log)
    with StandInFleet(["healthy"]) as fleet:
        (url,) = fleet.urls
        listen = f"127.0.0.1:{free_port()}"
        src = DirectScrapeSource(
            targets.from_urls([url]), discover=False, settings=Settings(0.2), timeout=0.6
        )
        src = tapped(src, f"{listen}={url}", [f"{url}={log}"], False, False)
        src.start()
        try:
            app = build_console_app(src, interval=0.2)
            async with app.run_test(size=(200, 50)) as pilot:
                await wait_for(pilot, lambda: app.table.row_count == 1, what="the row")
                # a request through the tee (the stand-in answers 404: recorded as is)
                r = httpx.post(f"http://{listen}/v1/completions", json={"model": "m"}, timeout=10)
                cell = lambda: str(app.table.get_row_at(0)[4])  # noqa: E731
                await wait_for(pilot, lambda: cell().endswith("· tee 0"), what="the tee cell")
                await pilot.press("enter")
                await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
                summary = lambda: str(app.screen.query_one("#d-summary").render())  # noqa: E731
                await wait_for(pilot, lambda: "1 seen" in summary(), what="the requests")
                text = summary()
                assert f"requests (tee http://{listen} -> {url})" in text
                assert f"{r.status_code}  POST /v1/completions  m" in text
                assert f"log {log}" in text and "NoSuchArchForCausalLM" in text
        finally:
            src.close()
