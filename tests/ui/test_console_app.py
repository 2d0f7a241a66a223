"""The console TUI, built by the CLI's factory, fed by stand-in servers (healthy, busy,
stalled, hung, dead, 401, non-vLLM) through the real direct-scrape source; plus one
SVG snapshot of a deterministic fleet."""

from __future__ import annotations

import os
import time

import pytest

from opsctl.console import judge as c
from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import EndpointTracker, Settings
from opsctl.console.local import collect_detail
from opsctl.console.view_app import DetailScreen, HelpScreen, build_console_app
from opsctl.console.view_detail import LatencyTable
from opsctl.domain.metrics import parse_samples
from opsctl.serve.view_panels import ProcessPanel
from tests.standins.fleet_source import FixedSource
from tests.standins.vllm_server import MODES, Endpoint, StandInFleet, answer


async def wait_for(pilot, cond, timeout: float = 30.0, what: str = "the console") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


def states(app) -> dict[str, str]:
    return {v.target.url: v.state for v in app.last.endpoints} if app.last else {}


def rows(app) -> list[list[str]]:
    t = app.table
    return [[str(x) for x in t.get_row_at(i)] for i in range(t.row_count)]


@pytest.fixture
def fleet():
    with StandInFleet(list(MODES)) as f:
        yield f


@pytest.fixture
def live(fleet):
    settings = Settings(interval_s=0.2, stall_window_s=1.0)
    src = DirectScrapeSource(
        targets.from_urls(fleet.urls), discover=False, settings=settings, timeout=0.6
    )
    src.start()
    yield fleet, src
    src.close()


EXPECTED = dict(
    zip(
        MODES,
        ("ready", "busy", "stalled", "unreachable", "dead", "unauthorized", "unreachable"),
        strict=True,
    )
)


@pytest.mark.anyio
async def test_fleet_shows_every_state_filters_sorts_and_drills_in(live):
    fleet, src = live
    app = build_console_app(src, interval=0.2)
    want = {url: EXPECTED[ep.mode] for url, ep in zip(fleet.urls, fleet.endpoints, strict=True)}
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: states(app) == want, what=f"states {want}")
        header = str(app.header.render())
        assert "7 endpoints" in header and "stalled 1" in header and "unreachable 2" in header
        stalled = next(r for r in rows(app) if r[1] == "stalled")
        assert stalled[4] == "16" and "generation tokens flat" in stalled[-1]
        # filter
        await pilot.press("slash", *"dead")
        await wait_for(pilot, lambda: app.table.row_count == 1)
        assert rows(app)[0][1] == "dead"
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.table.row_count == 7)
        # sort by state (name -> state), then reverse
        await pilot.press("s")
        await wait_for(pilot, lambda: [r[1] for r in rows(app)] == sorted(r[1] for r in rows(app)))
        await pilot.press("S")
        await wait_for(pilot, lambda: rows(app)[0][1] == "unreachable")
        # drill into the busy endpoint
        busy_row = [r[1] for r in rows(app)].index("busy")
        app.table.move_cursor(row=busy_row)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
        screen = app.screen
        await wait_for(pilot, lambda: "BUSY" in str(screen.query_one("#d-summary").render()))
        # the engine facts come with a poll of their own, retried until every path answered
        await wait_for(pilot, lambda: "vLLM 0.32.0" in str(screen.query_one("#d-summary").render()),
                       what="the engine facts")  # fmt: skip
        summary = str(screen.query_one("#d-summary").render())
        assert "vLLM 0.32.0" in summary and "max model len 256" in summary
        figures = str(screen.query_one("#d-figures").render())
        assert "requests running 4" in figures and "local_compute 100 %" in figures
        lat = screen.query_one(LatencyTable)
        assert lat.row_count == 7 and str(lat.get_row_at(0)[0]) == "TTFT"
        await wait_for(pilot, lambda: len(src.series(screen.url, "generation_tps")) >= 3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailScreen))
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        # pause and resume
        await pilot.press("p")
        await wait_for(pilot, lambda: "PAUSED" in str(app.header.render()))
        await pilot.press("p")
        n = src.tracker(fleet.urls[0]).scrapes
        await wait_for(pilot, lambda: src.tracker(fleet.urls[0]).scrapes > n, what="resumed polls")
        await pilot.press("q")


@pytest.mark.anyio
async def test_stalled_then_ready_again_and_unchanged_rows_are_not_redrawn(fleet):
    settings = Settings(interval_s=0.2, stall_window_s=1.0)
    url = fleet.urls[0]  # healthy
    src = DirectScrapeSource(targets.from_urls([url]), discover=False, settings=settings)
    src.start()
    app = build_console_app(src, interval=0.2)
    try:
        async with app.run_test(size=(200, 30)) as pilot:
            await wait_for(pilot, lambda: states(app).get(url) == "ready")
            await wait_for(pilot, lambda: src.tracker(url).scrapes >= 3)
            deadline = time.monotonic() + 30
            while True:  # three ticks with no poll landing among them (a poll brings news)
                polls = src.tracker(url).scrapes
                app.tick()  # draws what the polls since the app's last tick brought (rates)
                before = app.table.renders
                for _ in range(3):
                    app.tick()
                if src.tracker(url).scrapes == polls:
                    break
                assert time.monotonic() < deadline, "a poll landed among every three ticks"
                await pilot.pause(0.02)
            assert app.table.renders == before  # nothing changed, nothing redrawn
            fleet.set_mode(0, "stalled")
            await wait_for(pilot, lambda: states(app).get(url) == "stalled")
            assert app.table.renders > before
            fleet.set_mode(0, "busy")
            await wait_for(pilot, lambda: states(app).get(url) == "busy")
            fleet.set_mode(0, "healthy")
            await wait_for(pilot, lambda: states(app).get(url) == "ready")
    finally:
        src.close()


@pytest.mark.anyio
async def test_local_endpoint_drill_in_shows_the_process_tree(fleet):
    me = c.Target("local", fleet.urls[0], "discovered", pid=os.getpid())
    settings = Settings(interval_s=0.2)
    src = DirectScrapeSource([me], discover=False, settings=settings)
    src.start()
    app = build_console_app(src, interval=0.2, detail_fn=collect_detail)
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_for(pilot, lambda: states(app).get(me.url) == "ready")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
            panel = app.screen.query_one(ProcessPanel)
            table = panel.query_one("DataTable")
            await wait_for(pilot, lambda: table.row_count >= 2, what="process rows")
            assert str(table.get_row_at(0)[0]) == str(os.getpid())
            assert "APIServer" in str(table.get_row_at(0)[1])
    finally:
        src.close()


class StaticSource(FixedSource):
    """A FleetSource over trackers fed fixed scrapes (the stand-ins' own answers)."""

    name = "direct"

    def __init__(self) -> None:
        settings = Settings(interval_s=1.0, stall_window_s=10.0)
        self.trackers: list[EndpointTracker] = []
        for i, mode in enumerate(MODES):
            target = c.Target(f"node-{i}-{mode}", f"http://10.0.0.{i + 1}:8000", "targets")
            tr = EndpointTracker(target, settings)
            ep = Endpoint(mode)
            for t in range(0, 13):
                tr.observe(self._scrape(ep, target.url, 1000.0 + t, t))
            self.trackers.append(tr)

    @staticmethod
    def _scrape(ep: Endpoint, url: str, now: float, step: int) -> c.Scrape:
        if ep.mode == "hung":
            h = c.HttpStatus("/health", None, "timed out after 2 s")
            return c.Scrape(url, now - 2, now, h, c.HttpStatus("/metrics", None), None)
        if ep.mode == "busy":
            # exact counters: a clock-driven advance made the rate 200.8 under a CPU hog
            ep.gen, ep.steps, ep.frozen = 737.0 + 200 * step, 737.0 + 4 * step, True
        raw = {p: answer(ep, p).split(b"\r\n\r\n", 1) for p in ("/health", "/metrics")}
        status = {p: int(head.split(b" ")[1]) for p, (head, _) in raw.items()}
        text = raw["/metrics"][1].decode()
        samples = parse_samples(text) if status["/metrics"] == 200 else None
        auth = c.HttpStatus("/health", 401) if status["/health"] == 401 else None
        info = (
            c.EngineInfo("0.32.0", (c.ModelInfo("tiny-llama", 256),), None, now)
            if samples
            else None
        )
        return c.Scrape(url, now - 0.01, now, c.HttpStatus("/health", status["/health"]),
                        c.HttpStatus("/metrics", status["/metrics"]), samples, info, auth)  # fmt: skip

    def series(self, url: str, name: str) -> list[float]:
        return next(t.series(name) for t in self.trackers if t.target.url == url)

    def collect(self) -> c.FleetSnapshot:
        return c.FleetSnapshot(1012.0, tuple(t.view for t in self.trackers), 1.0)


def test_console_snapshot(snap_compare):
    app = build_console_app(StaticSource(), interval=3600)

    async def shown(pilot):
        await wait_for(pilot, lambda: app.table.row_count == len(MODES))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(200, 16), run_before=shown)
