"""The console's fleet view: the fleet table's columns and cells, the filter, the header.

``COLUMNS`` and ``row_cells`` are the TUI's view of opsctl.console.columns, the one
declaration ``--once``'s table reads too; the filter is ``matches``, the header (counts by
state) ``header_text`` and ``FleetHeader``. The table widget itself, a Line API widget over
a row model, is ``opsctl.console.view_fleet_table.FleetTable``.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from opsctl.console.columns import FLEET_TABLE, Row, cells
from opsctl.console.judge import EndpointView, FleetSnapshot
from opsctl.console.judge_advisor import findings as advisor_findings
from opsctl.console.judge_state import state_counts

STATE_STYLE = {
    "starting": "yellow",
    "ready": "bold green",
    "busy": "bold cyan",
    "stalled": "bold magenta",
    "dead": "bold red",
    "unreachable": "red",
    "unauthorized": "bold yellow",
    "restarted": "bold blue",
}
# (key, header) of the fleet table, in order: every column of the one declaration
# (opsctl.console.columns.FLEET_TABLE, which --once's table reads too)
COLUMNS = tuple((c.key, c.header) for c in FLEET_TABLE)


def row_cells(v: EndpointView, now: float, interval: float, note: str = "") -> tuple[str, ...]:
    """One endpoint's fleet-table cells, in COLUMNS order (``note``: the check column)."""
    return cells(FLEET_TABLE, v, Row(now, interval, note))


def matches(v: EndpointView, text: str) -> bool:
    """Whether every word of the filter ``text`` is in the endpoint's searchable text.

    That text: name, URL, state, source, reason, model ids, labels and advisor finding codes.
    """
    if not text:
        return True
    hay = " ".join(
        (v.target.name, v.target.url, v.state, v.target.source, v.reason or "",
         *(m.id for m in v.info.models), *(f"{k}={x}" for k, x in v.target.labels),
         *(a.code for a in advisor_findings(v)))
    ).lower()  # fmt: skip
    return all(word in hay for word in text.lower().split())


def header_text(
    snap: FleetSnapshot, shown: int, filt: str, readonly: bool, extra: str = ""
) -> Text:
    """The header line: endpoints by state, source and interval, filter, paused, readonly, hint."""
    counts = state_counts(snap.endpoints)
    t = Text()
    t.append(f" {len(snap.endpoints)} endpoints ", style="bold")
    for state, style in STATE_STYLE.items():
        if counts.get(state):
            t.append(f" {state} {counts[state]} ", style=f"reverse {style}")
            t.append(" ")
    t.append(f"  source {snap.source}, every {snap.interval_s:g} s", style="dim")
    if filt:
        t.append(f"  filter '{filt}': {shown} shown", style="yellow")
    if snap.paused:
        t.append("  PAUSED", style="bold reverse yellow")
    if readonly:
        t.append("  readonly", style="dim")
    if extra:
        t.append(f"  {extra}", style="bold reverse cyan")
    if snap.hint:
        t.append(f"\n {snap.hint}", style="italic")
    return t


class FleetHeader(Static):
    """The fleet header line; redrawn only when its text or styles change."""

    DEFAULT_CSS = "FleetHeader { height: auto; padding: 0 1; }"

    def show(self, text: Text) -> None:
        """Show ``text`` unless it is what is already shown."""
        if getattr(self, "_last_plain", None) != (text.plain, str(text.spans)):
            self._last_plain = (text.plain, str(text.spans))
            self.update(text)
