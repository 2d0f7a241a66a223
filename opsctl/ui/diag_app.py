"""A Textual app hosting one DiagPanel, running a check in a worker thread.

The check is the same callable the plain CLI runs: ``call(progress) -> report``; its
typed progress events (opsctl.checks.events) become panel state. Quitting while it runs
cancels it at its next event (its session stops any engine it started) and the app
waits for it to unwind (opsctl.ui.worker_app).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.widgets import Footer, Header

from opsctl.checks import events as ev
from opsctl.ui.panels.diag import DiagPanel
from opsctl.ui.worker_app import WorkerApp


class DiagApp(WorkerApp):
    """One check's live panel: its phase, events, table and verdict."""

    TITLE = "opsctl diag"
    STOPPING = "stopping… (cleaning up the engine)"

    def __init__(self, title: str, pipeline: Callable[[ev.Progress], Any]) -> None:
        super().__init__(pipeline)
        self.diag_title = title

    def compose(self) -> ComposeResult:
        """Header, the check's panel, footer."""
        yield Header()
        yield DiagPanel(self.diag_title, id="panel")
        yield Footer()

    def on_mount(self) -> None:
        """Title the screen and start the check."""
        self.sub_title = self.diag_title
        self.start_work()

    def _emit(self, event: ev.Event | dict) -> None:
        """The check's progress callback (its worker thread): events become panel state."""
        self.check_cancelled()
        snap = event if isinstance(event, dict) else event.snapshot()
        if snap:
            self.call_from_thread(self.query_one(DiagPanel).update_snapshot, snap)

    def show_error(self, exc: BaseException) -> None:
        """The check's error as the panel's last event and a failing verdict."""
        self.call_from_thread(
            self.query_one(DiagPanel).update_snapshot,
            {"phase": "error", "events": [f"error: {exc}"], "verdict": "fail"},
        )
