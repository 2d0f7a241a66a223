"""``opsctl certify --tui``: the checks as a live list, each with its own DiagPanel.

Left: one row per check (verdict, time), plus "certify" on top for the whole run (the
summary table, engine starts and stops). Right: the selected row's panel. The view
follows the running check until the user picks a row (Enter or a click); ``f`` follows
again. The certification itself is the same ``call(progress) -> CertifyReport`` the
plain CLI runs, in a worker thread; its events (opsctl.checks.certify's CheckStarted,
CheckProgress, CheckDone and the plain ones) become panel state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import ContentSwitcher, DataTable, Footer, Header

from opsctl.checks import certify as check
from opsctl.checks import events as ev
from opsctl.domain import certify as certify_dom
from opsctl.ui.panels.diag import DiagPanel
from opsctl.ui.worker_app import WorkerApp, run_for_report

OVERALL = "certify"


class CertifyApp(WorkerApp):
    """The certification's checks as a live list beside the selected check's panel."""

    TITLE = "opsctl certify"
    BINDINGS = [("f", "follow", "Follow the running check")]
    STOPPING = "stopping… (the engine is being stopped)"
    CSS = """
    #checks { width: 42; border: round $accent; }
    #panels { width: 1fr; }
    """

    def __init__(self, call: Callable[[ev.Progress], Any], title: str = "certify") -> None:
        super().__init__(call)
        self.run_title = title
        self.following = True
        self.rows: dict[str, list[str]] = {
            c: [c, "pending", "-"] for c in certify_dom.certify_checks()
        }

    def compose(self) -> ComposeResult:
        """Header, the checks' list beside their panels (the whole run's, then each check's)."""
        yield Header()
        with Horizontal():
            yield DataTable(id="checks", cursor_type="row")
            with ContentSwitcher(initial=f"panel-{OVERALL}", id="panels"):
                yield DiagPanel(self.run_title, id=f"panel-{OVERALL}")
                for c in certify_dom.certify_checks():
                    yield DiagPanel(certify_dom.title(c), id=f"panel-{c}")
        yield Footer()

    def on_mount(self) -> None:
        """Fill the list (every check pending, the run running) and start the certification."""
        table = self.query_one("#checks", DataTable)
        for name in ("check", "verdict", "time"):
            table.add_column(name, key=name)
        table.add_row(OVERALL, "running", "-", key=OVERALL)
        for c in certify_dom.certify_checks():
            table.add_row(*self.rows[c], key=c)
        self.sub_title = self.run_title
        self.start_work()

    # ---- events (worker thread) ----------------------------------------------------------
    def _emit(self, event: ev.Event) -> None:
        self.check_cancelled()
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
        """The DiagPanel of check ``name`` (or of the whole run, ``certify``)."""
        return self.query_one(f"#panel-{name}", DiagPanel)

    def set_row(self, name: str, verdict: str, seconds: str) -> None:
        """Show ``verdict`` (lower case) and ``seconds`` in the list row of ``name``."""
        table = self.query_one("#checks", DataTable)
        table.update_cell(name, "verdict", verdict.lower(), update_width=True)
        table.update_cell(name, "time", seconds, update_width=True)

    def show(self, name: str) -> None:
        """Put the panel of ``name`` on screen."""
        self.query_one("#panels", ContentSwitcher).current = f"panel-{name}"

    # ---- keys ------------------------------------------------------------------------------
    def on_data_table_row_selected(self, message: DataTable.RowSelected) -> None:
        """A row picked (Enter or a click): show its panel and stop following the running check."""
        if message.row_key.value is not None:
            self.following = False
            self.show(str(message.row_key.value))

    def action_follow(self) -> None:
        """Follow the running check again (``f``)."""
        self.following = True


def run_tui(call: Callable[[ev.Progress], Any], title: str = "certify") -> Any:
    """Run the certification under the app; its report (errors re-raised after exit)."""
    return run_for_report(CertifyApp(call, title))
