"""A reusable diagnostic panel: phase, verdict, a findings/results table and an event log.

It is fed with the progress snapshots every diag pipeline emits (plain dicts):

    {"title": str?, "phase": str, "columns": [str], "rows": [[str]],
     "events": [str] (new lines), "verdict": "pass" | "fail" | None, "summary": str?,
     "warnings": [str]?}

Warnings (e.g. test knobs active in the engine) stay on top of the head once given.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, RichLog, Static


class DiagPanel(Vertical):
    """One check's live view: a head (warnings, phase, verdict, summary), a table, an event log."""

    DEFAULT_CSS = """
    DiagPanel { border: round $accent; height: 1fr; }
    DiagPanel > #diag-head { height: auto; padding: 0 1; }
    DiagPanel > DataTable { height: 2fr; }
    DiagPanel > RichLog { height: 1fr; border-top: solid $panel; }
    """

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self._columns: tuple[str, ...] = ()
        self.last: dict = {}

    def compose(self) -> ComposeResult:
        """The head, the findings table and the event log."""
        yield Static("starting", id="diag-head")
        yield DataTable(zebra_stripes=True, id="diag-table")
        yield RichLog(id="diag-log", wrap=True, markup=False, max_lines=500)

    def update_snapshot(self, snap: dict) -> None:
        """Merge ``snap`` into the view: head redrawn, table reset when given, new events logged."""
        from rich.markup import escape

        self.last = {**self.last, **snap}
        verdict = snap.get("verdict")
        head = "".join(
            f"[b yellow]warning:[/] {escape(w)}\n" for w in self.last.get("warnings") or ()
        )
        head += f"phase: {self.last.get('phase', '?')}"
        if verdict:
            colour = "green" if verdict == "pass" else "red"
            head += f"   verdict: [b {colour}]{verdict.upper()}[/]"
        if snap.get("summary"):
            head += f"\n{snap['summary']}"
        self.query_one("#diag-head", Static).update(head)
        table = self.query_one("#diag-table", DataTable)
        columns = tuple(snap.get("columns") or ())
        if columns and columns != self._columns:
            table.clear(columns=True)
            table.add_columns(*columns)
            self._columns = columns
        if "rows" in snap:
            table.clear()
            for row in snap["rows"]:
                table.add_row(*[str(c) for c in row])
        log = self.query_one("#diag-log", RichLog)
        for line in snap.get("events", []):
            log.write(line)
