"""The console TUI's GPU column and drill-in, fed the NVML reading recorded on the H200
under load (tests/data/gpu/console/serve) through a GpuFeed, for an endpoint with the
recorded engine's process roles; and on a host without a GPU no GPU column at all."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from textual.widgets import Static

from opsctl.collectors.gpu import GpuFeed
from opsctl.console.judge import (
    BUSY,
    EndpointView,
    EngineInfo,
    Figures,
    FleetSnapshot,
    LocalState,
    ModelInfo,
    ProcRole,
    Target,
)
from opsctl.console.view_app import DetailScreen, build_console_app
from opsctl.domain.gpu import HostGpus, host_from_raw
from tests.standins.fleet_source import FixedSource

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "console" / "serve"
URL = "http://127.0.0.1:8000"


class OneEndpoint(FixedSource):
    """A FleetSource of one fixed local endpoint (the recorded engine's pids and roles)."""

    live = True

    def __init__(self) -> None:
        doc = json.loads((DATA / "console-load.json").read_text())
        roles = tuple(ProcRole(p["pid"], p["role"]) for p in doc["endpoints"][0]["pids"])
        target = Target("tiny-llama@run", URL, "opsctl-run", pid=roles[0].pid)
        self.view = EndpointView(
            target, BUSY, None, Figures(running=8.0), EngineInfo("0.26.0", (ModelInfo("tiny-llama", 256),)),
            LocalState(True, procs=roles), 200, time.time(), time.time(), 5, 0, 0.01,
        )  # fmt: skip

    def series(self, url: str, name: str) -> list[float]:
        return []

    def collect(self) -> FleetSnapshot:
        return FleetSnapshot(time.time(), (self.view,), 0.2)


async def until(pilot, cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


def test_row_shows_the_gpu_and_the_drill_in_each_gpu_and_process():
    raw = json.loads((DATA / "raw-load.json").read_text())
    feed = GpuFeed(0.2, read=lambda pids: host_from_raw(raw))
    app = build_console_app(OneEndpoint(), 0.2, gpu_feed=feed, detail_fn=lambda *a, **k: None)

    async def run() -> None:
        async with app.run_test(size=(220, 50)) as pilot:
            table = app.table

            def gpu_cell() -> str:
                if table.gpu_cells is None or not table.row_count:
                    return ""
                return str(table.get_cell(URL, "gpu"))

            await until(pilot, lambda: gpu_cell() == "GPU0 7% 130/140G", "the GPU cell")
            assert [c.label.plain for c in table.columns.values()][-1] == "GPU"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the drill-in")

            def figures() -> str:
                try:
                    return str(app.screen.query_one("#d-figures", Static).render())
                except Exception:
                    return ""

            await until(pilot, lambda: "EngineCore pid 3738" in figures(), "the GPU block")
            text = figures()
            assert "GPU0 NVIDIA H200  util 7 %  mem 129.8/140.4 GiB" in text
            assert "power 122/700 W" in text and "clocks SM 1980 / mem 3201 MHz" in text

    asyncio.run(run())
    assert feed._stop.is_set()  # the app closed its feed


def test_no_gpu_column_on_a_host_without_a_gpu():
    feed = GpuFeed(0.2, read=lambda pids: HostGpus(time.time(), None, (), "no GPU"))
    app = build_console_app(OneEndpoint(), 0.2, gpu_feed=feed, detail_fn=lambda *a, **k: None)

    async def run() -> None:
        async with app.run_test(size=(200, 20)) as pilot:
            await until(pilot, lambda: feed.collections >= 2 and app.table.row_count, "collections")
            await until(
                pilot, lambda: app.last is not None and app.last.host_gpus is not None, "a tick"
            )
            assert app.table.gpu_cells is None
            assert "GPU" not in [c.label.plain for c in app.table.columns.values()]
            assert app.last.host_gpus.reason == "no GPU" and app.last.endpoints[0].gpus == ()

    asyncio.run(run())
