"""Test knobs recorded in the engine's ledger show as a warning on top of the serve
dashboard's StatePanel and of a diag's live panel; nothing shows without them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from opsctl.serve.collect import from_dict
from opsctl.serve.view_app import build_serve_app
from opsctl.serve.view_panels import StatePanel

FIXTURE = Path(__file__).parent / "fixtures" / "serve_snapshots.jsonl"


def ready_snapshot():
    snaps = [from_dict(json.loads(line)) for line in FIXTURE.read_text().splitlines()]
    return snaps[3]


async def wait_for(pilot, cond, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for the dashboard"
        await pilot.pause(0.02)


@pytest.mark.anyio
@pytest.mark.parametrize("armed", [{}, {"OPSCTL_PROBE_NUDGE": "zebra:3"}])
async def test_state_panel_warns_about_active_knobs(armed):
    snap = dataclasses.replace(ready_snapshot(), test_knobs=armed)
    assert from_dict(json.loads(json.dumps(snap.to_dict()))).test_knobs == armed  # replayable
    app = build_serve_app(lambda: snap, interval=3600, clock=False)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_for(pilot, lambda: app.polls >= 1)
        warning = app.query_one(StatePanel).query_one("#knob-warning")
        if armed:
            assert warning.display
            text = str(warning.render())
            assert "TEST KNOBS" in text and "OPSCTL_PROBE_NUDGE=zebra:3" in text
        else:
            assert not warning.display


@pytest.mark.anyio
async def test_diag_panel_keeps_warnings_on_top():
    from textual.app import App

    from opsctl.ui.panels.diag import DiagPanel

    class Host(App):
        def compose(self):
            yield DiagPanel("diag x")

    app = Host()
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(DiagPanel)
        panel.update_snapshot({"phase": "engine up", "columns": ["a"], "rows": []})
        panel.update_snapshot({"warnings": ["TEST KNOBS active in this engine (K=v)"]})
        panel.update_snapshot({"events": ["later"]})
        await pilot.pause()
        head = str(panel.query_one("#diag-head").render())
        assert head.startswith("warning: TEST KNOBS active") and "phase: engine up" in head
