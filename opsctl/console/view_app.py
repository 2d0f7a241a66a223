"""The fleet console (Textual): a FleetSource read on a timer, drawn as the fleet table.

The app does not know which kind of source it reads: ``collect()`` is a cheap in-memory
read, polling happens in the source's own thread. The fleet table repaints only the rows
on screen that changed; the drill-in reads local details in a worker thread, only while
it is open. ``build_console_app`` is the one factory (CLI and tests); ``run_console``
runs it under the engine lifetime policy.

Actions (checks, servers, admin calls, reaping, bundles; opsctl.console.view_actions)
run in worker threads; a check's result stays on its endpoint's row (column "check")
and in the drill-in. With ``record`` every frame (snapshot + row notes) is written as
JSONL (opsctl.console.replay); a replay source adds step and speed keys and no actions.

Keys: ``?`` help (lists every key), ``/`` filter, Enter drill-in, Esc back, ``s``/``S``
sort, ``r`` refresh now, ``p`` pause, ``q`` quit; actions ``d j n x R c a b t :``.
A stalled local endpoint's stacks are taken once per stall (opsctl.console.stall_stacks)
and shown in its drill-in; ``t`` takes them on demand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.timer import Timer
from textual.widgets import Footer, Input

from opsctl.collectors.gpu import GpuFeed
from opsctl.console.actions import Jobs
from opsctl.console.judge import DEAD, FleetSnapshot
from opsctl.console.local import LocalDetail, collect_detail
from opsctl.console.servers import ServerManager
from opsctl.console.source import FleetSource
from opsctl.console.stall_stacks import StallStacks
from opsctl.console.view_actions import ActionsMixin, JobEvent, ServerChanged
from opsctl.console.view_checks import ChecksScreen
from opsctl.console.view_detail import SPARKS
from opsctl.console.view_fleet_table import FleetTable
from opsctl.console.view_panel import COLUMNS, FleetHeader, header_text, matches
from opsctl.console.view_screens import DetailScreen, HelpScreen, actions_text

__all__ = ["ConsoleApp", "DetailScreen", "HelpScreen", "build_console_app", "run_console"]
REPLAY_ACTIONS = {"step_forward", "step_back", "faster", "slower"}
BUNDLE_NOTE = "dead: b bundles its run"


class ConsoleApp(ActionsMixin, App):
    """The fleet console: header, filter, fleet table, command line; drill-in and checks screens."""

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
        Binding("d", "run_check", "Check"),
        Binding("j", "checks", "Checks"),
        Binding("n", "new_server", "Serve"),
        Binding("x", "stop_server", "Stop"),
        Binding("R", "restart_server", "Restart", show=False),
        Binding("c", "reap", "Reap", show=False),
        Binding("a", "admin", "Admin"),
        Binding("b", "bundle", "Bundle", show=False),
        Binding("t", "stacks", "Stacks", show=False),
        Binding("colon", "command", "Command", key_display=":"),
        Binding("full_stop", "step_forward", "Step", key_display="."),
        Binding("comma", "step_back", "Back step", key_display=",", show=False),
        Binding("plus", "faster", "Faster", key_display="+"),
        Binding("minus", "slower", "Slower", key_display="-", show=False),
    ]
    CSS = """
    #filter, #command { display: none; }
    #filter.on, #command.on { display: block; }
    """

    def __init__(
        self,
        source: FleetSource,
        interval: float = 1.0,
        readonly: bool = False,
        detail_fn: Callable[..., LocalDetail | None] = collect_detail,
        tick: float | None = None,
        record: Path | None = None,
        api_key: str | None = None,
        engine_factory: Callable | None = None,
        gpu_feed: GpuFeed | None = None,
    ) -> None:
        super().__init__()
        from opsctl.console.replay import Recorder, ReplaySource

        self.recorder = Recorder(record) if record is not None else None
        self.source = source
        self.interval = interval
        self.tick_s = tick if tick is not None else min(interval, 1.0)
        self.replaying = isinstance(source, ReplaySource)  # step/speed keys, no actions
        self.readonly = readonly or self.replaying
        self.api_key = api_key
        self.detail_fn = detail_fn
        self.filter_text = ""
        self.last: FleetSnapshot | None = None
        self.notes: dict[str, str] = {}
        self.ticks = 0
        self._tick_asked = False  # a key's tick is queued (they coalesce into one)
        self._refresh_timer: Timer | None = None
        # GPU figures per host and endpoint (a thread of their own); a replay has its own
        own = source.live and not source.attaches_gpus
        self.gpu_feed = gpu_feed if gpu_feed is not None or not own else GpuFeed(interval)
        self.action_log: list[str] = []
        self.stall_stacks = StallStacks()  # taken once per stall, or with t
        self.jobs = Jobs(on_event=lambda job, snap: self.post_message(JobEvent(job, snap)))
        self.servers = ServerManager(
            on_change=lambda m: self.post_message(ServerChanged(m)), engine_factory=engine_factory
        )

    def compose(self) -> ComposeResult:
        """The fleet header, the filter box, the fleet table, the command box, the footer."""
        yield FleetHeader(id="fleet-header")
        yield Input(placeholder="filter: words (Esc clears)", id="filter")
        yield FleetTable(id="fleet")
        yield Input(placeholder=": command (e.g. diag invariance; Esc cancels)", id="command")
        yield Footer()

    def on_mount(self) -> None:
        """Keep the fleet screen's widgets, focus the table and start ticking every ``tick_s``."""
        # kept: App.query_one looks at the active screen, which may be a drill-in
        self.table = self.query_one(FleetTable)
        self.header = self.query_one(FleetHeader)
        self.filter_box = self.query_one("#filter", Input)
        self.command_box = self.query_one("#command", Input)
        self.table.focus()
        self.tick()
        self.set_interval(self.tick_s, self.tick)

    def on_unmount(self) -> None:
        """Checks stop at their next step; servers this console started stop now."""
        self.jobs.cancel_all()
        self.servers.close()
        if self.gpu_feed is not None:
            self.gpu_feed.close()
        if self.recorder is not None:
            self.recorder.close()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Replay keys (step, speed) only in a replay; every other action is allowed."""
        if action in REPLAY_ACTIONS:
            return self.replaying
        return True

    def ask_tick(self) -> None:
        """A tick soon, for a key (filter typing, pause); keys asked before it runs draw once."""
        if not self._tick_asked:
            self._tick_asked = True
            self.call_later(self._asked_tick)

    def _asked_tick(self) -> None:
        self._tick_asked = False
        self.tick()

    def tick(self) -> None:
        """Read the source and show it; a tick over idle endpoints draws nothing.

        The table and header touch only what changed. A dead opsctl run's row offers its
        bundle; a drill-in on screen gets its endpoint's fresh data and actions.
        """
        snap = self.source.collect()
        if self.gpu_feed is not None:
            snap = self.gpu_feed.apply(snap)
        self.last = snap
        self.ticks += 1
        if self.replaying:
            notes = self.source.notes()  # type: ignore[attr-defined]
        else:
            notes = self.jobs.notes()
            for v in snap.endpoints:  # a dead run offers its forensics bundle
                if v.state == DEAD and v.target.run_dir and v.target.url not in notes:
                    notes[v.target.url] = BUNDLE_NOTE
        self.notes = notes
        if not self.replaying:
            self.stall_stacks.observe(snap.endpoints)
        if self.recorder is not None:
            self.recorder.write(snap, notes)
        views = [v for v in snap.endpoints if matches(v, self.filter_text)]
        now = snap.taken_at
        extra = self.source.status_line() if self.replaying else ""  # type: ignore[attr-defined]
        self.header.show(header_text(snap, len(views), self.filter_text, self.readonly, extra))
        self.table.host_gpus = snap.host_gpus
        self.table.show(views, now, snap.interval_s, notes)
        if not self.screen_stack:  # shutting down: the refresh timer fired after the last pop
            return
        screen = self.screen
        if isinstance(screen, DetailScreen) and screen.ready:
            view = next((v for v in snap.endpoints if v.target.url == screen.url), None)
            if view is not None:
                series = {k: self.source.series(screen.url, k) for k, _ in SPARKS}
                ours = self.servers.owned(view.target.url) is not None
                jobs = self.jobs.for_url(view.target.url)
                stacks = self.stall_stacks.lines(view.target.url)
                block = actions_text(view, jobs, ours, self.readonly, stacks)
                if self.replaying and view.target.url in notes:
                    block = f"{notes[view.target.url]}\n{block}"
                with contextlib.suppress(NoMatches):  # still mounting: the next tick draws it
                    screen.show(view, now, snap.interval_s, series, block)

    def selected_url(self) -> str | None:
        """The URL of the endpoint in focus: the drill-in's, the shown check's or the cursor's."""
        screen = self.screen
        if isinstance(screen, DetailScreen):
            return screen.url
        if isinstance(screen, ChecksScreen):
            job = screen.job(screen.shown)
            return job.url if job else None
        return self.table.selected_url()

    # ---- navigation ----------------------------------------------------------------------
    def action_help(self) -> None:
        """Show the help screen (``?``)."""
        self.push_screen(HelpScreen())

    def action_filter(self) -> None:
        """Open the filter box (``/``)."""
        box = self.filter_box
        box.add_class("on")
        box.focus()

    def action_command(self) -> None:
        """Open the command line (``:``) on the fleet screen, keeping the endpoint selected.

        From a drill-in or the checks screen it goes back to the fleet screen first.
        """
        url = self.selected_url()
        while len(self.screen_stack) > 1:
            self.pop_screen()
        if url is not None and url in self.table.cells:
            self.table.move_cursor(row=self.table.get_row_index(url))
        box = self.command_box
        box.value = ""
        box.add_class("on")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter typing: the table follows at the next tick."""
        if event.input.id == "filter":
            self.filter_text = event.value.strip()
            self.ask_tick()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the command box runs the command; either box gives focus back to the table."""
        if event.input.id == "command":
            text = event.value.strip().lstrip(":")
            self.command_box.remove_class("on")
            self.table.focus()
            if text:
                self.run_command(text)
            return
        self.table.focus()

    def action_back(self) -> None:
        """Esc: close and clear an open filter or command box."""
        for box in (self.filter_box, self.command_box):
            if box.has_class("on"):
                box.value = ""
                box.remove_class("on")
                self.table.focus()

    def action_drill(self) -> None:
        """Drill into the selected endpoint (Enter on the fleet screen)."""
        url = self.table.selected_url()
        if url is not None and self.screen is self.screen_stack[0]:
            self.push_screen(DetailScreen(url))
            self.call_after_refresh(self.tick)

    def on_fleet_table_row_selected(self, event: FleetTable.RowSelected) -> None:
        """Enter on the table, or a click on the cursor's row: drill in."""
        self.action_drill()  # Enter on the table, or a click on the cursor's row

    def action_sort_next(self) -> None:
        """Sort by the next column (``s``)."""
        table = self.table
        keys = [k for k, _ in COLUMNS]
        nxt = keys[(keys.index(table.sort_col) + 1) % len(keys)] if table.sort_col else keys[0]
        table.sort_by(nxt)
        self.notify(f"sorted by {dict(COLUMNS)[nxt]}", timeout=1.5)

    def action_sort_reverse(self) -> None:
        """Reverse the sort (``S``; by name when none was chosen)."""
        table = self.table
        table.sort_by(table.sort_col or "name")

    def action_refresh_now(self) -> None:
        """Poll now (``r``) and redraw 0.2 s later; presses meanwhile share that redraw."""
        self.source.refresh()
        if self._refresh_timer is None:  # pressed again meanwhile: the same redraw

            def done() -> None:
                self._refresh_timer = None
                self.tick()

            self._refresh_timer = self.set_timer(0.2, done)

    def action_pause(self) -> None:
        """Pause or resume polling (``p``)."""
        self.source.set_paused(not self.source.paused)
        self.tick()

    # ---- replay --------------------------------------------------------------------------
    def action_step_forward(self) -> None:
        """Replay: one frame forward (``.``)."""
        self.source.step(1)  # type: ignore[attr-defined]
        self.tick()

    def action_step_back(self) -> None:
        """Replay: one frame back (``,``)."""
        self.source.step(-1)  # type: ignore[attr-defined]
        self.tick()

    def action_faster(self) -> None:
        """Replay: play faster (``+``)."""
        self.source.faster()  # type: ignore[attr-defined]
        self.tick()

    def action_slower(self) -> None:
        """Replay: play slower (``-``)."""
        self.source.slower()  # type: ignore[attr-defined]
        self.tick()


def build_console_app(source: FleetSource, interval: float = 1.0, **kw) -> ConsoleApp:
    """The console over ``source``, drawn every ``interval`` seconds (options: ConsoleApp's)."""
    return ConsoleApp(source, interval, **kw)


def run_console(app: ConsoleApp) -> None:
    """Run the console in this terminal under the engine lifetime policy.

    A stop signal exits the app, and the engines it started stop with it (on_unmount).
    """
    from opsctl.ui.runner import run_app

    run_app(app)
