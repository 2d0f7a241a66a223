"""The console's help and drill-in screens.

The drill-in shows one endpoint: fleet data on every tick, local details (process tree
with PSS, Engram tables, ledger, log tail) every DETAIL_EVERY_S in a worker thread,
the checks run on it from the console (result, first finding) and the actions it
offers (a dead opsctl run offers its forensics bundle)."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from opsctl.console.actions import CheckJob
from opsctl.console.judge import DEAD, EndpointView
from opsctl.console.local import LocalDetail
from opsctl.console.view_detail import (
    EngramPanel,
    LatencyTable,
    SparkPanel,
    figures_text,
    server_info_text,
    summary_text,
)
from opsctl.serve.view_panels import LedgerPanel, LogPanel, ProcessPanel

HELP = """\
[b]opsctl console[/b]: keys

  ↑/↓        move in the fleet table (PgUp/PgDn a page, Home/End first/last row)
  Enter      drill into the endpoint under the cursor (or click its row again)
  Esc        back (closes the filter, the command line, the drill-in, this help)
  /          filter rows (words match name, url, state, model, labels, reason)
  s / S      sort by the next column / reverse the order (or click a header)
  r          poll every endpoint now
  p          pause / resume polling (a replay: pause / play)
  ?          this help
  q          quit (servers this console started stop with it)

[b]actions[/b] on the selected endpoint (none with --readonly; * asks first)
  d          run a check that fits its model (diag usage / mm-uuid / invariance;
             kv-fail for servers opsctl started: it starts its own engine)
  j          the checks run from here and their live panels (K cancels one)
  n          start a server (embedded model or model directory, dummy/real weights)
  x  *       stop it (servers opsctl started)
  R  *       restart it (servers this console started)
  c  *       reap orphaned engines (opsctl runs clean)
  a          vLLM admin call (reset_prefix_cache*, sleep*, wake_up, is_sleeping,
             pause*, resume, is_paused, server_info, load, version); a 404 says
             which server setting exposes the route
  b          forensics bundle of its opsctl run (opsctl runs bundle)
  t          take the stacks of its processes now (local servers; a stalled one's
             are taken once when it is judged stalled), shown in its drill-in
  :          command mode, the CLI's verbs: diag CHECK, serve [MODEL] [--weights
             dummy|real] [--port N], stop, restart, runs clean [--older-than D],
             runs bundle [--out FILE], admin ROUTE, checks, help, quit

[b]replay[/b] (--replay FILE): p pause/play, . step, , step back, + faster, - slower

States: starting, ready, busy, stalled (requests running, generation, steps and KV cache
flat for the stall window, /health may still say 200), dead, unreachable, unauthorized,
restarted.
'-' is missing data; 'Ns stale' is the age of data older than 1.5 polls."""


class HelpScreen(ModalScreen):
    """The console's keys, modes and states (``?`` opens it, Esc or ``?`` closes it)."""

    BINDINGS = [("escape", "dismiss", "Back"), ("question_mark", "dismiss", "Back")]
    DEFAULT_CSS = "HelpScreen { align: center middle; } #help { width: 90; border: round $accent; padding: 1 2; background: $panel; }"

    def compose(self) -> ComposeResult:
        """The help text."""
        yield Static(HELP, id="help")


def actions_text(
    view: EndpointView,
    jobs: list[CheckJob],
    ours: bool,
    readonly: bool,
    stacks: list[str] | None = None,
) -> str:
    """The drill-in's checks and actions block (rich markup).

    ``stacks``: the lines of the stacks the console took of it (opsctl.console.stall_stacks),
    first.
    """
    lines = [f"[b]{escape(s)}[/]" if i == 0 else escape(s) for i, s in enumerate(stacks or ())]
    for j in jobs[-5:]:
        colour = {"pass": "green", "fail": "red"}.get(j.verdict or "", "yellow")
        lines.append(f"[{colour}]{escape(j.note())}[/]  (j: its panel)")
    if not jobs:
        lines.append("no check run from this console yet (d: run one)")
    if readonly:
        lines.append("[dim]readonly: no actions[/]")
        return "\n".join(lines)
    offers = ["d check", "a admin"]
    if ours or view.target.run_dir:
        offers += ["x stop"] + (["R restart"] if ours else [])
    if view.target.run_dir:
        offers.append("b forensics bundle")
    if view.local is not None or view.target.pid:
        offers.append("t stacks")
    lines.append("actions: " + ", ".join(offers))
    if view.state == DEAD and view.target.run_dir:
        lines.append(
            "[b red]dead[/]: b writes a forensics bundle of its run (log, meta, ledger, "
            "events, environment with secrets redacted)"
        )
    return "\n".join(lines)


class DetailScreen(Screen):
    """One endpoint. Fleet data on every tick; local details every DETAIL_EVERY_S."""

    BINDINGS = [("escape", "app.pop_screen", "Back"), ("r", "app.refresh_now", "Refresh")]
    DEFAULT_CSS = """
    #d-summary, #d-figures, #d-info, #d-actions { height: auto; padding: 0 1; }
    #d-actions { border: round $accent; }
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
        self.ready = False  # composed: show() may run

    def compose(self) -> ComposeResult:
        """Summary, checks and actions, figures, latency, sparklines, server info, local panels."""
        with VerticalScroll():
            yield Static(id="d-summary")
            yield Static(id="d-actions")
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

    def on_mount(self) -> None:
        """Title the actions box; from now on show() may run."""
        self.query_one("#d-actions").border_title = "checks and actions"
        self.ready = True

    def show(self, view: EndpointView, now: float, interval: float, series, actions: str) -> None:
        """One tick of the endpoint: fleet data now, local details when DETAIL_EVERY_S has passed.

        The local details are collected in a worker thread (``app.detail_fn``), then shown by
        :meth:`show_detail`; their panels are hidden for an endpoint without a pid.
        """
        self.query_one("#d-summary", Static).update(summary_text(view, now, interval))
        self.query_one("#d-actions", Static).update(actions)
        self.query_one("#d-figures", Static).update(figures_text(view))
        self.query_one(LatencyTable).show(view)
        self.query_one(SparkPanel).show(series)
        self.query_one("#d-info", Static).update(server_info_text(view))
        local = self.query_one("#d-local")
        local.display = view.target.pid is not None
        if view.target.pid is not None and now - self.detail_at >= self.DETAIL_EVERY_S:
            self.detail_at = now
            app = self.app  # read here: in the worker's thread a closed screen has no app
            app.run_worker(
                lambda: self._collect(app, view), thread=True, group="detail", exclusive=True
            )

    def _collect(self, app, view: EndpointView) -> None:
        detail = app.detail_fn(view.target)
        if detail is not None and app.is_running:
            app.call_from_thread(self.show_detail, detail)

    def show_detail(self, d: LocalDetail) -> None:
        """Show the local details: process tree, Engram tables, ledger, log tail (those it has).

        Not on a screen closed while they were collected (the detail worker's late answer)."""
        if not self.is_attached:
            return
        self.detail = d
        self.query_one(ProcessPanel).update_snapshot(d)
        self.query_one(EngramPanel).update_snapshot(d)
        self.query_one(LedgerPanel).update_snapshot(d)
        self.query_one(LedgerPanel).display = bool(d.ledger)
        self.query_one(LogPanel).update_snapshot(d)
        self.query_one(LogPanel).display = bool(d.log_tail)
