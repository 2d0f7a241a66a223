"""``opsctl certify --tui``: the checks as a live list, each with its own DiagPanel.

Left: one row per check (verdict, time), plus "certify" on top for the whole run (the
summary table, engine starts and stops). Right: the selected row's panel. The view
follows the running check until the user picks a row (Enter or a click); ``f`` follows
again. The certification itself is the same ``call(progress) -> CertifyReport`` the
plain CLI runs, in a worker thread; its events (opsctl.checks.certify's CheckStarted,
CheckProgress, CheckDone and the plain ones) become panel state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.widgets import ContentSwitcher, DataTable, Footer, Header

from opsctl.checks import certify as check
from opsctl.checks import events as ev
from opsctl.domain import certify as dom
from opsctl.ui.panels.diag import DiagPanel

OVERALL = "certify"


class Cancelled(KeyboardInterrupt):
    """Raised inside the certification when the user quits."""


class CertifyApp(App):
    TITLE = "opsctl certify"
    BINDINGS = [("q", "quit_certify", "Quit"), ("f", "follow", "Follow the running check")]
    CSS = """
    #checks { width: 42; border: round $accent; }
    #panels { width: 1fr; }
    """

    def __init__(self, call: Callable[[ev.Progress], Any], title: str = "certify") -> None:
        super().__init__()
        self.call = call
        self.run_title = title
        self.report: Any = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.following = True
        self.rows: dict[str, list[str]] = {c: [c, "pending", "-"] for c in dom.certify_checks()}

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield DataTable(id="checks", cursor_type="row")
            with ContentSwitcher(initial=f"panel-{OVERALL}", id="panels"):
                yield DiagPanel(self.run_title, id=f"panel-{OVERALL}")
                for c in dom.certify_checks():
                    yield DiagPanel(dom.title(c), id=f"panel-{c}")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#checks", DataTable)
        for name in ("check", "verdict", "time"):
            table.add_column(name, key=name)
        table.add_row(OVERALL, "running", "-", key=OVERALL)
        for c in dom.certify_checks():
            table.add_row(*self.rows[c], key=c)
        self.sub_title = self.run_title
        self.run_worker(self._work, thread=True, exclusive=True)

    # ---- events (worker thread) ----------------------------------------------------------
    def _emit(self, event: ev.Event) -> None:
        if self.cancelled.is_set():
            raise Cancelled()
        self.call_from_thread(self.apply, event)

    def apply(self, event: ev.Event) -> None:
        """One event into the view (UI thread; tests call it directly)."""
        if isinstance(event, check.CheckProgress):
            self.panel(event.check).update_snapshot(event.event.snapshot())
            return
        if isinstance(event, check.CheckStarted):
            self.set_row(event.check, "running", "-")
            if self.following:
                self.show(event.check)
        elif isinstance(event, check.CheckDone):
            self.set_row(event.name, event.verdict, f"{event.seconds:.1f} s")
            self.panel(event.name).update_snapshot({"verdict": event.verdict})
        elif isinstance(event, ev.Table):
            for name, verdict, seconds, _ in event.rows:
                if verdict == "skipped":
                    self.set_row(name, verdict, seconds)
        elif isinstance(event, ev.Finished):
            self.set_row(OVERALL, event.verdict, "-")
        snap = event.snapshot()
        if snap:
            self.panel(OVERALL).update_snapshot(snap)

    def panel(self, name: str) -> DiagPanel:
        return self.query_one(f"#panel-{name}", DiagPanel)

    def set_row(self, name: str, verdict: str, seconds: str) -> None:
        table = self.query_one("#checks", DataTable)
        table.update_cell(name, "verdict", verdict.lower(), update_width=True)
        table.update_cell(name, "time", seconds, update_width=True)

    def show(self, name: str) -> None:
        self.query_one("#panels", ContentSwitcher).current = f"panel-{name}"

    # ---- keys ------------------------------------------------------------------------------
    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        if message.row_key.value is not None:
            self.following = False
            self.show(str(message.row_key.value))

    def action_follow(self) -> None:
        self.following = True

    def _work(self) -> None:
        try:
            self.report = self.call(self._emit)
        except BaseException as exc:  # reported by the command after the app exits
            self.error = exc
        finally:
            self.done.set()

    def action_quit_certify(self) -> None:
        if not self.done.is_set():
            self.cancelled.set()
            self.notify("stopping… (the engine is being stopped)")
            self.set_interval(0.2, self._exit_when_done)
        else:
            self.exit()

    def _exit_when_done(self) -> None:
        if self.done.is_set():
            self.exit()

    def on_stop_signal(self) -> None:
        """A stop signal (opsctl.ui.runner): cancel the run and stop its engines now."""
        from opsctl.engine.server import stop_all

        self.cancelled.set()
        stop_all()


def run_tui(call: Callable[[ev.Progress], Any], title: str = "certify") -> Any:
    """Run the certification under the app; its report (errors re-raised after exit)."""
    from opsctl.ui.runner import run_app

    app = CertifyApp(call, title)
    run_app(app)
    if app.error is not None:
        raise app.error
    if app.report is None:
        raise KeyboardInterrupt
    return app.report
