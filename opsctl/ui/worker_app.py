"""The base of the apps that run one check call in a worker thread (diag's panel, certify).

The call is the same one the plain CLI runs: ``call(progress) -> report``. Quitting while
it runs cancels it at its next event (its session stops any engine it started) and the app
waits for it to unwind; a stop signal cancels it and stops this process's engines at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.app import App

from opsctl.checks import events as ev


class Cancelled(KeyboardInterrupt):
    """Raised inside the running call when the user quits the app."""


class WorkerApp(App):
    """An app running ``call(progress)`` in a worker thread; ``q`` cancels it and waits.

    Subclasses start the work with :meth:`start_work` (usually on mount), turn events into
    view state in ``_emit`` (calling :meth:`check_cancelled` first) and may show an error
    in :meth:`show_error`. After the app exits, :func:`run_for_report` returns the report.
    """

    BINDINGS = [("q", "quit_work", "Quit")]
    STOPPING = "stopping…"  # the note shown while the cancelled call unwinds

    def __init__(self, call: Callable[[ev.Progress], Any]) -> None:
        super().__init__()
        self.call = call
        self.report: Any = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.done = threading.Event()

    def start_work(self) -> None:
        """Start the call in a worker thread, reporting to ``_emit``."""
        self.run_worker(self._work, thread=True, exclusive=True)

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` in the worker thread once the user has quit."""
        if self.cancelled.is_set():
            raise Cancelled()

    def _emit(self, event: ev.Event) -> None:
        self.check_cancelled()

    def show_error(self, exc: BaseException) -> None:
        """Show the call's error (worker thread; not called after a cancel); none by default."""

    def _work(self) -> None:
        try:
            self.report = self.call(self._emit)
        except BaseException as exc:  # reported by the command after the app exits
            self.error = exc
            if not self.cancelled.is_set():
                self.show_error(exc)
        finally:
            self.done.set()

    def action_quit_work(self) -> None:
        """Quit: at once when the call is done, else cancel it and exit once it unwound."""
        if not self.done.is_set():
            self.cancelled.set()
            self.notify(self.STOPPING)
            self.set_interval(0.2, self._exit_when_done)
        else:
            self.exit()

    def _exit_when_done(self) -> None:
        if self.done.is_set():
            self.exit()

    def on_stop_signal(self) -> None:
        """A stop signal (opsctl.ui.runner, main thread): cancel the call, stop engines now.

        The call's worker thread may be blocked in a long wait, so the engines this process
        started are stopped right here; the runner exits the app.
        """
        from opsctl.engine.server import stop_all

        self.cancelled.set()
        stop_all()


def run_for_report(app: WorkerApp) -> Any:
    """Run ``app`` through the one runner; its report (its error re-raised after exit).

    Quitting before a report exists raises KeyboardInterrupt.
    """
    from opsctl.ui.runner import run_app

    run_app(app)
    if app.error is not None:
        raise app.error
    if app.report is None:
        raise KeyboardInterrupt
    return app.report
