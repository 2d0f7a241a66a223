"""The serve dashboard, built by the CLI's own factory, fed recorded snapshots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opsctl.serve.collect import from_dict
from opsctl.serve.view_app import build_serve_app, replay_source
from opsctl.serve.view_panels import LedgerPanel, MetricsPanel, ProcessPanel, StatePanel

FIXTURE = Path(__file__).parent / "fixtures" / "serve_snapshots.jsonl"


def recorded():
    return [from_dict(json.loads(line)) for line in FIXTURE.read_text().splitlines()]


def text_of(widget) -> str:
    return str(widget.render())


async def wait_for(pilot, cond, timeout: float = 30.0) -> None:
    """Pause until cond() holds (polls run in a worker thread, which a loaded machine may
    schedule late); fails on the deadline so a timeout reads as a timeout."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the dashboard"
        await pilot.pause(0.02)


@pytest.mark.anyio
async def test_dashboard_walks_from_starting_to_ready_with_metrics_and_ledger():
    replay = replay_source(FIXTURE)
    shown: list[str] = []
    app = build_serve_app(replay, interval=0.01, clock=False)
    original_show = app.show

    def show(snap):
        shown.append(snap.state)
        original_show(snap)

    app.show = show
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: app.polls >= 6 and len(shown) >= 3)
        assert shown[:3] == ["starting", "loading", "ready"]
        state_line = text_of(app.query_one(StatePanel).query_one("#state-line"))
        assert "READY" in state_line and "healthy after" in state_line
        proc_table = app.query_one(ProcessPanel).query_one("DataTable")
        roles = {str(proc_table.get_row_at(i)[1]).strip() for i in range(proc_table.row_count)}
        assert {"APIServer", "EngineCore", "Worker"} <= roles
        ledger = app.query_one(LedgerPanel).query_one("DataTable")
        statuses = {str(ledger.get_row_at(i)[3]) for i in range(ledger.row_count)}
        assert "already upstream" in statuses
        metrics = text_of(app.query_one(MetricsPanel).query_one("#metrics-text"))
        assert "requests running" in metrics and "generation tok/s" in metrics
        assert max(app.query_one(MetricsPanel).history) > 100  # the recorded burst


@pytest.mark.anyio
async def test_dead_engine_stays_on_screen_with_reason_and_code_1():
    last = recorded()[-1]
    dead = dataclasses.replace(last, state="dead", death_reason=("EngineCore: RuntimeError: boom",))
    app = build_serve_app(
        lambda: dead, interval=0.01, clock=False, until=lambda s: 1 if s.state == "dead" else None
    )
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: app.polls >= 1 and app.result_code is not None)
        assert app.result_code == 1 and app.is_running  # waits for the user
        detail = text_of(app.query_one(StatePanel).query_one("#state-detail"))
        assert "RuntimeError: boom" in detail
        await pilot.press("q")
    assert not app.is_running


def test_dashboard_snapshot(snap_compare):
    snaps = recorded()
    ready = snaps[3]
    app = build_serve_app(lambda: ready, interval=3600, clock=False)

    def tables_settled() -> bool:
        # a DataTable measures its columns when its own message queue runs empty; on a
        # busy machine the snapshot could otherwise catch the new rows at the old widths
        return all(
            not t._require_update_dimensions and not t._updated_cells
            for t in app.query("DataTable")
        )

    async def first_poll_shown(pilot):
        await wait_for(pilot, lambda: app.polls >= 1)
        await wait_for(pilot, tables_settled)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(140, 48), run_before=first_poll_shown)
