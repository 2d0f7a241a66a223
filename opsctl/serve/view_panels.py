"""Panels of the serve dashboard, each fed a ServeSnapshot via ``update_snapshot``."""

from __future__ import annotations

import weakref
from collections import deque

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, ProgressBar, Sparkline, Static

from opsctl.output import human_bytes
from opsctl.serve.collect import ServeSnapshot

STATE_STYLE = {
    "starting": "yellow",
    "loading": "cyan",
    "ready": "bold green",
    "dead": "bold red",
    "stopped": "dim",
}


def _fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


class StatePanel(Vertical):
    """The engine's state: test-knob warning, state line, load progress bar and load details."""

    DEFAULT_CSS = """
    StatePanel { height: auto; border: round $accent; padding: 0 1; }
    StatePanel > ProgressBar { width: 60; }
    """

    def compose(self) -> ComposeResult:
        """The knob warning (hidden until knobs are active), state line, load bar, detail."""
        warning = Static(id="knob-warning")  # on top; shown only while test knobs are active
        warning.display = False
        yield warning
        yield Static(id="state-line")
        yield ProgressBar(total=8, show_eta=False, id="load-bar")
        yield Static(id="state-detail")

    def on_mount(self) -> None:
        """Title the panel."""
        self.border_title = "engine"

    def update_snapshot(self, s: ServeSnapshot) -> None:
        """Show ``s``: state, model, URL, elapsed and healthy times, load, death reason, run dir."""
        from opsctl.domain.knobs import warning as knob_warning

        knob = knob_warning(s.test_knobs)
        warn = self.query_one("#knob-warning", Static)
        warn.update(Text(f"warning: {knob}", style="bold black on yellow") if knob else "")
        warn.display = knob is not None
        line = Text()
        line.append(f" {s.state.upper()} ", style=f"reverse {STATE_STYLE.get(s.state, '')}")
        line.append(f"  {s.model} ({s.load_format} weights)  {s.url}  elapsed {s.elapsed_s:.0f} s")
        if s.time_to_healthy_s is not None:
            line.append(f"  healthy after {s.time_to_healthy_s:.1f} s", style="green")
        self.query_one("#state-line", Static).update(line)
        bar = self.query_one("#load-bar", ProgressBar)
        bar.update(total=s.progress.total, progress=s.progress.step)
        detail = f"load phase: {s.progress.phase}"
        if s.progress.weights_seconds is not None:
            detail += f"  weights {s.progress.weights_seconds:.2f} s"
        if s.progress.engine_init_seconds is not None:
            detail += f"  engine init {s.progress.engine_init_seconds:.2f} s"
        if s.first_death:
            head, *rest = s.first_death
            detail += f"\n[b red]first rank death:[/] {escape(head)}"
            detail += "".join(f"\n{escape(line)}" for line in rest)
        if s.death_reason:
            detail += "\n[b red]why it died:[/] " + "\n".join(s.death_reason)
        detail += f"\nrun dir: {s.run_dir}"
        self.query_one("#state-detail", Static).update(detail)


def _fixed_columns(table: DataTable, columns: tuple[tuple[str, int], ...]) -> None:
    """Fixed column widths: columns do not jump as values change, and the header never
    waits for the table's idle-time measuring (a busy machine drew it at stale widths)."""
    for label, width in columns:
        table.add_column(label, width=width)


_SHOWN: weakref.WeakKeyDictionary[DataTable, list[tuple[str, ...]]] = weakref.WeakKeyDictionary()


def _replace_rows(table: DataTable, rows: list[tuple[str, ...]]) -> None:
    """Show ``rows``; an unchanged table is left alone (no clear, no redraw)."""
    if _SHOWN.get(table) == rows:
        return
    _SHOWN[table] = rows
    table.clear()
    for row in rows:
        table.add_row(*row)


class TablePanel(Vertical):
    """A titled panel holding one DataTable of fixed COLUMNS ((label, width) pairs)."""

    TABLE_ID = ""
    PANEL_TITLE = ""
    COLUMNS: tuple[tuple[str, int], ...] = ()

    def compose(self) -> ComposeResult:
        """The panel's table (no cursor)."""
        yield DataTable(id=self.TABLE_ID, cursor_type="none")

    def on_mount(self) -> None:
        """Title the panel and give its table the fixed columns."""
        self.border_title = self.PANEL_TITLE
        _fixed_columns(self.query_one(DataTable), self.COLUMNS)


class ProcessPanel(TablePanel):
    """The server's process tree by rank, with a total row.

    Pid, role (indented by depth), state, CPU %, RSS and PSS. A row per process in the tree's rank order (the collector's): the API server, the DP
    coordinator, each ``EngineCore_DPi`` followed by its ``Worker_*``, helpers last."""

    DEFAULT_CSS = "ProcessPanel { height: auto; max-height: 16; border: round $accent; }"
    TABLE_ID = "proc-table"
    PANEL_TITLE = "process tree (by rank)"
    COLUMNS = (
        ("pid", 8),
        ("role", 26),
        ("state", 9),
        ("CPU %", 6),
        ("RSS", 11),
        ("PSS", 11),
        ("note", 34),
    )

    def update_snapshot(self, s: ServeSnapshot) -> None:
        """Show the process tree of ``s`` with its RSS and PSS totals."""
        rows = []
        depth = {s.tree.root_pid: 0}
        for p in s.tree.processes:
            depth[p.pid] = depth.get(p.ppid, -1) + 1
            indent = "  " * max(depth[p.pid], 0)
            rows.append(
                (
                    str(p.pid),
                    f"{indent}{p.role}",
                    p.status,
                    _fmt(p.cpu_percent, ".0f"),
                    human_bytes(p.rss),
                    human_bytes(p.pss),
                    p.error or "",
                )
            )
        rows.append(
            (
                "",
                "[b]total[/]",
                "",
                "",
                human_bytes(s.tree.total_rss),
                human_bytes(s.tree.total_pss),
                "",
            )
        )
        _replace_rows(self.query_one(DataTable), rows)


class MetricsPanel(Vertical):
    """The server's /metrics figures and a sparkline of generation tok/s (last 60 polls)."""

    DEFAULT_CSS = """
    MetricsPanel { height: auto; border: round $accent; padding: 0 1; }
    MetricsPanel > Sparkline { height: 3; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.history: deque[float] = deque([0.0] * 60, maxlen=60)

    def compose(self) -> ComposeResult:
        """The figures text above the generation sparkline."""
        yield Static(id="metrics-text")
        yield Sparkline(list(self.history), id="gen-spark")

    def on_mount(self) -> None:
        """Title the panel."""
        self.border_title = "metrics (/metrics)"

    def update_snapshot(self, s: ServeSnapshot) -> None:
        """Show the figures of ``s`` (or that /metrics is awaited) and extend the sparkline."""
        m = s.metrics
        if m is None:
            self.query_one("#metrics-text", Static).update("waiting for /metrics…")
            return
        kv = None if m.kv_cache_usage is None else m.kv_cache_usage * 100
        text = (
            f"requests running {_fmt(m.running, '.0f')}   waiting {_fmt(m.waiting, '.0f')}   "
            f"KV cache usage {_fmt(kv, '.1f', ' %')}\n"
            f"prompt tok/s {_fmt(m.prompt_tps)}   generation tok/s {_fmt(m.generation_tps)}   "
            f"TTFT {_fmt(None if m.ttft_mean_s is None else m.ttft_mean_s * 1000, '.0f', ' ms')}   "
            f"totals: prompt {_fmt(m.prompt_tokens_total, '.0f')} gen {_fmt(m.generation_tokens_total, '.0f')}"
        )
        self.query_one("#metrics-text", Static).update(text)
        self.history.append(m.generation_tps or 0.0)
        self.query_one("#gen-spark", Sparkline).data = list(self.history)


class LedgerPanel(TablePanel):
    """The patch ledger per rank: per process (its rank role) and patch, status and detail."""

    DEFAULT_CSS = "LedgerPanel { height: auto; max-height: 10; border: round $accent; }"
    TABLE_ID = "ledger-table"
    PANEL_TITLE = "patch ledger (per rank)"
    COLUMNS = (("pid", 8), ("rank", 20), ("patch", 22), ("status", 17), ("detail", 52))

    def update_snapshot(self, s: ServeSnapshot) -> None:
        """Show the ledger entries of ``s`` (in rank order: the collector's)."""
        rows = [(str(e.pid), e.who, e.name, e.status, e.detail[:52]) for e in s.ledger]
        _replace_rows(self.query_one(DataTable), rows)


class LogPanel(Vertical):
    """The tail of the server's log."""

    DEFAULT_CSS = "LogPanel { height: 1fr; border: round $accent; }"

    def compose(self) -> ComposeResult:
        """The log text."""
        yield Static(id="log-text")

    def on_mount(self) -> None:
        """Title the panel."""
        self.border_title = "server log"

    def update_snapshot(self, s: ServeSnapshot) -> None:
        """Show the log tail of ``s`` (each line cut at 200 chars)."""
        self.query_one("#log-text", Static).update(
            Text("\n".join(line[:200] for line in s.log_tail))
        )
