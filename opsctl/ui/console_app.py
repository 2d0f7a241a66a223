"""The fleet console (Textual). It reads a FleetSource (not knowing which kind) on a
timer: ``collect()`` is a cheap in-memory read, polling happens in the source's own
thread. The fleet table re-renders only changed cells; the drill-in reads local
details (process tree with PSS, Engram tables, ledger, log tail) in a worker thread,
only while it is open. ``build_console_app`` is the one factory (CLI and tests).

Keys: ``?`` help, ``/`` filter, Enter drill-in, Esc back, ``s``/``S`` sort by next
column / reverse, ``r`` refresh now, ``p`` pause, ``q`` quit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Static

from opsctl.console.local import LocalDetail, collect_detail
from opsctl.console.source import FleetSource
from opsctl.domain.console import EndpointView, FleetSnapshot
from opsctl.ui.panels.console import COLUMNS, FleetHeader, FleetTable, header_text, matches
from opsctl.ui.panels.console_detail import (
    SPARKS,
    EngramPanel,
    LatencyTable,
    SparkPanel,
    figures_text,
    server_info_text,
    summary_text,
)
from opsctl.ui.panels.serve import LedgerPanel, LogPanel, ProcessPanel

HELP = """\
[b]opsctl console[/b]: keys

  ↑/↓        move in the fleet table
  Enter      drill into the endpoint under the cursor
  Esc        back (closes the filter, the drill-in, this help)
  /          filter rows (words match name, url, state, model, labels, reason)
  s / S      sort by the next column / reverse the order (or click a header)
  r          poll every endpoint now
  p          pause / resume polling
  ?          this help
  q          quit

States: starting, ready, busy, stalled (requests running, generation flat for the
stall window, /health may still say 200), dead, unreachable, unauthorized, restarted.
'-' is missing data; 'Ns stale' is the age of data older than 1.5 polls."""


class HelpScreen(ModalScreen):
    BINDINGS = [("escape", "dismiss", "Back"), ("question_mark", "dismiss", "Back")]
    DEFAULT_CSS = "HelpScreen { align: center middle; } #help { width: 84; border: round $accent; padding: 1 2; background: $panel; }"

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class DetailScreen(Screen):
    """One endpoint. Fleet data on every tick; local details every DETAIL_EVERY_S."""

    BINDINGS = [("escape", "app.pop_screen", "Back"), ("r", "app.refresh_now", "Refresh")]
    DEFAULT_CSS = """
    #d-summary, #d-figures, #d-info { height: auto; padding: 0 1; }
    #d-top { height: auto; }
    #d-top > LatencyTable { border: round $accent; margin-right: 1; }
    #d-top > SparkPanel { width: 1fr; }
    """
    DETAIL_EVERY_S = 2.0

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.detail: LocalDetail | None = None
        self.detail_at = 0.0

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="d-summary")
            yield Static(id="d-figures")
            with Horizontal(id="d-top"):
                yield LatencyTable()
                yield SparkPanel()
            yield Static(id="d-info")
            with Vertical(id="d-local"):
                yield ProcessPanel()
                yield EngramPanel()
                yield LedgerPanel()
                yield LogPanel()
        yield Footer()

    def show(self, view: EndpointView, now: float, interval: float, series) -> None:
        self.query_one("#d-summary", Static).update(summary_text(view, now, interval))
        self.query_one("#d-figures", Static).update(figures_text(view))
        self.query_one(LatencyTable).show(view)
        self.query_one(SparkPanel).show(series)
        self.query_one("#d-info", Static).update(server_info_text(view))
        local = self.query_one("#d-local")
        local.display = view.target.pid is not None
        if view.target.pid is not None and now - self.detail_at >= self.DETAIL_EVERY_S:
            self.detail_at = now
            self.app.run_worker(
                lambda: self._collect(view), thread=True, group="detail", exclusive=True
            )

    def _collect(self, view: EndpointView) -> None:
        detail = self.app.detail_fn(view.target)  # type: ignore[attr-defined]
        if detail is not None:
            self.app.call_from_thread(self.show_detail, detail)

    def show_detail(self, d: LocalDetail) -> None:
        self.detail = d
        self.query_one(ProcessPanel).update_snapshot(d)
        self.query_one(EngramPanel).update_snapshot(d)
        self.query_one(LedgerPanel).update_snapshot(d)
        self.query_one(LedgerPanel).display = bool(d.ledger)
        self.query_one(LogPanel).update_snapshot(d)
        self.query_one(LogPanel).display = bool(d.log_tail)


class ConsoleApp(App):
    TITLE = "opsctl console"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("enter", "drill", "Drill in", show=True),
        Binding("escape", "back", "Back", show=False),
        Binding("r", "refresh_now", "Refresh"),
        Binding("p", "pause", "Pause"),
        Binding("s", "sort_next", "Sort"),
        Binding("S", "sort_reverse", "Reverse", show=False),
    ]
    CSS = "#filter { display: none; } #filter.on { display: block; }"

    def __init__(
        self,
        source: FleetSource,
        interval: float = 1.0,
        readonly: bool = False,
        detail_fn: Callable[..., LocalDetail | None] = collect_detail,
        tick: float | None = None,
        record: Path | None = None,
    ) -> None:
        super().__init__()
        from opsctl.console.replay import Recorder

        self.recorder = Recorder(record) if record is not None else None
        self.source = source
        self.interval = interval
        self.tick_s = tick if tick is not None else min(interval, 1.0)
        self.readonly = readonly
        self.detail_fn = detail_fn
        self.filter_text = ""
        self.last: FleetSnapshot | None = None
        self.ticks = 0

    def compose(self) -> ComposeResult:
        yield FleetHeader(id="fleet-header")
        yield Input(placeholder="filter: words (Esc clears)", id="filter")
        yield FleetTable(id="fleet")
        yield Footer()

    def on_mount(self) -> None:
        # kept: App.query_one looks at the active screen, which may be a drill-in
        self.table = self.query_one(FleetTable)
        self.header = self.query_one(FleetHeader)
        self.filter_box = self.query_one("#filter", Input)
        self.table.focus()
        self.tick()
        self.set_interval(self.tick_s, self.tick)

    def tick(self) -> None:
        snap = self.source.collect()
        self.last = snap
        if self.recorder is not None:
            self.recorder.write(snap)
        self.ticks += 1
        views = [v for v in snap.endpoints if matches(v, self.filter_text)]
        now = snap.taken_at
        self.header.show(header_text(snap, len(views), self.filter_text, self.readonly))
        self.table.show(views, now, snap.interval_s)
        screen = self.screen
        if isinstance(screen, DetailScreen):
            view = next((v for v in snap.endpoints if v.target.url == screen.url), None)
            if view is not None:
                series = {k: self.source.series(screen.url, k) for k, _ in SPARKS}
                screen.show(view, now, snap.interval_s, series)

    # ---- actions -------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_filter(self) -> None:
        box = self.filter_box
        box.add_class("on")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.tick()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    def action_back(self) -> None:
        box = self.filter_box
        if box.has_class("on"):
            box.value = ""
            box.remove_class("on")
            self.table.focus()

    def action_drill(self) -> None:
        url = self.table.selected_url()
        if url is not None and not isinstance(self.screen, DetailScreen | HelpScreen):
            self.push_screen(DetailScreen(url))
            self.call_after_refresh(self.tick)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, FleetTable):
            self.action_drill()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if isinstance(event.data_table, FleetTable):
            event.data_table.sort_by(str(event.column_key.value))

    def action_sort_next(self) -> None:
        table = self.table
        keys = [k for k, _ in COLUMNS]
        nxt = keys[(keys.index(table.sort_col) + 1) % len(keys)] if table.sort_col else keys[0]
        table.sort_by(nxt)
        self.notify(f"sorted by {dict(COLUMNS)[nxt]}", timeout=1.5)

    def action_sort_reverse(self) -> None:
        table = self.table
        table.sort_by(table.sort_col or "name")

    def action_refresh_now(self) -> None:
        self.source.refresh()
        self.set_timer(0.2, self.tick)

    def action_pause(self) -> None:
        paused = not (self.last.paused if self.last else False)
        self.source.set_paused(paused)
        self.tick()


def build_console_app(source: FleetSource, interval: float = 1.0, **kw) -> ConsoleApp:
    return ConsoleApp(source, interval, **kw)


def run_console(app: ConsoleApp) -> None:
    """Run the console in this terminal under the engine lifetime policy: a stop signal
    exits the app, and the engines it started stop with it."""
    from opsctl.engine import lifetime

    def exit_from_signal() -> None:
        if app._loop is not None:
            app._loop.call_soon_threadsafe(app.exit)

    try:
        with lifetime.tui_app(exit_from_signal):
            app.run()
    finally:
        if app.recorder is not None:
            app.recorder.close()
    lifetime.raise_if_received()
