"""A recorded console session replays to the same screens: the live console (fed by
deterministic trackers, a check result arriving on one row midway) records with
``record=``; the replay (``ReplaySource``, the same factory) stepped frame by frame shows
the same fleet table, the same header (less the replay marker) and the same drill-in
text; an SVG snapshot pins the replayed screen. Also the CLI: ``--replay FILE --once
--json`` prints the session's last frame; bad flag combinations are refused."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from opsctl.cli import app as cli
from opsctl.console import judge as c
from opsctl.console.actions import CheckChoice, CheckJob
from opsctl.console.judge_state import EndpointTracker, Settings
from opsctl.console.replay import ReplaySource
from opsctl.console.view_app import DetailScreen, build_console_app
from tests.standins.vllm_server import MODES, Endpoint
from tests.ui.test_console_app import StaticSource

FRAMES = 6


class SteppingSource(StaticSource):
    """StaticSource's fleet, one more scrape per endpoint at each ``advance()``."""

    def __init__(self) -> None:
        settings = Settings(interval_s=1.0, stall_window_s=10.0)
        self.trackers = []
        self.eps = []
        for i, mode in enumerate(MODES):
            target = c.Target(f"node-{i}-{mode}", f"http://10.0.0.{i + 1}:8000", "targets")
            tr = EndpointTracker(target, settings)
            ep = Endpoint(mode)
            for t in range(13):
                tr.observe(self._scrape(ep, target.url, 1000.0 + t, t))
            self.trackers.append(tr)
            self.eps.append(ep)
        self.n = 12

    def advance(self) -> None:
        self.n += 1
        for tr, ep in zip(self.trackers, self.eps, strict=True):
            tr.observe(self._scrape(ep, tr.target.url, 1000.0 + self.n, self.n))

    def collect(self) -> c.FleetSnapshot:
        return c.FleetSnapshot(1000.0 + self.n, tuple(t.view for t in self.trackers), 1.0)


def screen_lines(app) -> list[str]:
    return [s.text for s in app.screen._compositor.render_strips()]


def header(app) -> str:
    text = str(app.header.render()).split("  REPLAY")[0]
    return text.replace("  readonly", "")


def detail_text(app) -> dict[str, str]:
    s = app.screen
    return {w: str(s.query_one(w).render()) for w in ("#d-summary", "#d-figures", "#d-info")}


async def settle(pilot) -> None:
    await pilot.pause()
    await pilot.pause()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple:
    """One recorded session for the module's tests (they only read it): its file, and
    the live console's table lines, headers and drill-ins frame by frame."""
    import asyncio

    path = tmp_path_factory.mktemp("replay") / "session.jsonl"
    return (path, *asyncio.run(record_session(path)))


async def record_session(path) -> tuple[list[list[str]], list[str], list[dict]]:
    """Run the live console over FRAMES frames; its table lines, headers, drill-ins."""
    src = SteppingSource()
    app = build_console_app(src, interval=3600, readonly=True, record=path)
    tables, headers, details = [], [], []
    async with app.run_test(size=(200, 16)) as pilot:
        for i in range(FRAMES):
            if i:
                src.advance()
            if i == 2:  # a check result arrives on the busy row
                job = CheckJob(1, CheckChoice("invariance", ""), src.trackers[1].target.url,
                               "node-1-busy", state="done", verdict="pass")  # fmt: skip
                app.jobs.jobs.append(job)
            app.tick()
            await settle(pilot)
            tables.append(screen_lines(app)[1:-1])
            headers.append(header(app))
            app.table.move_cursor(row=app.table.get_row_index(src.trackers[1].target.url))
            await pilot.press("enter")
            await settle(pilot)
            app.tick()
            await settle(pilot)
            details.append(detail_text(app))
            await pilot.press("escape")
            await settle(pilot)
    return tables, headers, details


@pytest.mark.anyio
async def test_replay_shows_the_recorded_screens(recorded):
    recording, tables, headers, details = recorded
    assert "invariance: PASS" in "\n".join(tables[-1]) and "invariance" not in "\n".join(tables[0])
    # a clock that does not move: the frames change only by the keys pressed (with the
    # wall clock, a start of the app slower than the 1 s between frames, on busy cores,
    # had played frame 2 before the pause)
    src = ReplaySource(recording, clock=lambda: 0.0)
    assert len(src.frames) == FRAMES
    busy_url = src.frames[0][0].endpoints[1].target.url
    app = build_console_app(src, interval=3600)
    async with app.run_test(size=(200, 16)) as pilot:
        src.set_paused(True)
        app.tick()
        await settle(pilot)
        assert "REPLAY session.jsonl frame 1/6" in str(app.header.render())
        for i in range(FRAMES):
            if i:
                await pilot.press("full_stop")  # step
                await settle(pilot)
            assert f"frame {i + 1}/{FRAMES}" in str(app.header.render())
            assert header(app) == headers[i]
            assert screen_lines(app)[1:-1] == tables[i], f"frame {i + 1}"
            app.table.move_cursor(row=app.table.get_row_index(busy_url))
            await pilot.press("enter")
            await settle(pilot)
            app.tick()
            await settle(pilot)
            assert isinstance(app.screen, DetailScreen)
            assert detail_text(app) == details[i], f"drill-in at frame {i + 1}"
            await pilot.press("escape")
            await settle(pilot)
        await pilot.press("comma", "comma")  # two steps back
        await settle(pilot)
        assert f"frame {FRAMES - 2}/{FRAMES}" in str(app.header.render())
        assert screen_lines(app)[1:-1] == tables[FRAMES - 3]
        await pilot.press("plus", "plus")
        assert src.speed == 4.0
        await pilot.press("d")  # a replay takes no action
        assert app.action_log[-1].startswith(
            "readonly: running a check is disabled (this is a replay)"
        )


def test_replay_snapshot(recorded, snap_compare):
    src = ReplaySource(recorded[0])
    src.step(3)  # paused on frame 4
    app = build_console_app(src, interval=3600)

    async def shown(pilot):
        deadline = time.monotonic() + 30
        while app.table.row_count != len(MODES):
            assert time.monotonic() < deadline
            await pilot.pause(0.02)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(200, 16), run_before=shown)


def test_cli_replay_once_json_and_refusals(recorded, tmp_path):
    recording = recorded[0]
    runner = CliRunner()
    r = runner.invoke(cli, ["console", "--replay", str(recording), "--once", "--json"])
    assert r.exit_code == 1, r.output  # the fleet holds failing endpoints
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.console/4" and doc["taken_at"] == 1000.0 + 12 + FRAMES - 1
    assert {e["state"] for e in doc["endpoints"]} >= {"busy", "stalled", "dead"}
    busy = next(e for e in doc["endpoints"] if e["state"] == "busy")
    assert busy["requests_running"] == 4
    for extra in (["http://x:1"], ["--record", str(tmp_path / "r.jsonl")]):
        r = runner.invoke(cli, ["console", "--replay", str(recording), "--once", *extra])
        assert r.exit_code == 2, r.output
    r = runner.invoke(cli, ["console", "http://127.0.0.1:9", "--once", "--record", "x.jsonl"])
    assert r.exit_code == 2 and "--record writes the live console" in r.stderr
    (tmp_path / "no.jsonl").write_text("{}\n")
    r = runner.invoke(cli, ["console", "--replay", str(tmp_path / "no.jsonl"), "--once"])
    assert r.exit_code == 2 and "not a console recording" in r.stderr
