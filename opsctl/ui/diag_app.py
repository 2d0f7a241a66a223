"""A Textual app hosting one DiagPanel, running a check in a worker thread.

The check is the same callable the plain CLI runs: ``call(progress) -> report``; its
typed progress events (opsctl.checks.events) become panel state. Quitting while it runs
cancels it at its next event (its session stops any engine it started) and the app
waits for it to unwind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header

from opsctl.checks import events as ev
from opsctl.ui.panels.diag import DiagPanel


class Cancelled(KeyboardInterrupt):
    """Raised inside the pipeline when the user quits the dashboard."""


class DiagApp(App):
    BINDINGS = [("q", "quit_diag", "Quit")]
    TITLE = "opsctl diag"

    def __init__(self, title: str, pipeline: Callable[[ev.Progress], Any]) -> None:
        super().__init__()
        self.diag_title = title
        self.pipeline = pipeline
        self.report: Any = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.done = threading.Event()

    def compose(self) -> ComposeResult:
        yield Header()
        yield DiagPanel(self.diag_title, id="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.diag_title
        self.run_worker(self._work, thread=True, exclusive=True)

    def _emit(self, event: ev.Event | dict) -> None:
        """The check's progress callback (its worker thread): events become panel state."""
        if self.cancelled.is_set():
            raise Cancelled()
        snap = event if isinstance(event, dict) else event.snapshot()
        if snap:
            self.call_from_thread(self.query_one(DiagPanel).update_snapshot, snap)

    def _work(self) -> None:
        try:
            self.report = self.pipeline(self._emit)
        except BaseException as exc:  # reported by the command after the app exits
            self.error = exc
            if not self.cancelled.is_set():
                self.call_from_thread(
                    self.query_one(DiagPanel).update_snapshot,
                    {"phase": "error", "events": [f"error: {exc}"], "verdict": "fail"},
                )
        finally:
            self.done.set()

    def action_quit_diag(self) -> None:
        if not self.done.is_set():
            self.cancelled.set()
            self.notify("stopping… (cleaning up the engine)")
            self.set_interval(0.2, self._exit_when_done)
        else:
            self.exit()

    def _exit_when_done(self) -> None:
        if self.done.is_set():
            self.exit()

    def on_stop_signal(self) -> None:
        """A stop signal (opsctl.ui.runner, main thread): cancel the pipeline and stop
        the engines this process started right now (the pipeline's worker thread may be
        blocked in a long wait); the runner exits the app."""
        from opsctl.engine.server import stop_all

        self.cancelled.set()
        stop_all()
