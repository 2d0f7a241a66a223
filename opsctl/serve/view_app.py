"""The serve dashboard: a worker thread collects a ServeSnapshot, the UI thread renders it.

The next poll is armed only after rendering, so slow polls stretch the period instead of
piling up. ``build_serve_app`` is the one factory used by the CLI and tests (tests feed
recorded snapshots).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header

from opsctl.serve.collect import ServeSnapshot
from opsctl.serve.view_panels import LedgerPanel, LogPanel, MetricsPanel, ProcessPanel, StatePanel

PANELS = (StatePanel, ProcessPanel, MetricsPanel, LedgerPanel, LogPanel)


class ServeDashboard(App):
    """One vLLM server under ``opsctl serve``: state, process tree, metrics, ledger, log.

    ``until`` decides from each snapshot whether to stop, with which exit code.
    """

    TITLE = "opsctl serve"
    BINDINGS = [("q", "quit", "Stop server & quit"), ("ctrl+c", "quit", "Stop & quit")]
    CSS = """
    #top { height: auto; }
    #top > StatePanel { width: 1fr; }
    """

    def __init__(
        self,
        source: Callable[[], ServeSnapshot],
        interval: float = 1.0,
        record: Path | None = None,
        until: Callable[[ServeSnapshot], int | None] | None = None,
        clock: bool = True,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.source = source
        self.interval = interval
        self.record = record
        self.until = until  # returns an exit code to stop with, or None to go on
        self.last: ServeSnapshot | None = None
        self.result_code: int | None = None
        self.polls = 0

    def compose(self) -> ComposeResult:
        """Header, the state panel on top, process tree, metrics, ledger and log panels, footer."""
        yield Header(show_clock=self.clock)
        with Vertical():
            with Horizontal(id="top"):
                yield StatePanel()
            yield ProcessPanel()
            yield MetricsPanel()
            yield LedgerPanel()
            yield LogPanel()
        yield Footer()

    def on_ready(self) -> None:
        """Start polling (or exit at once when a stop signal came while the app started).

        Ready comes after the DOM is mounted and the first frame drawn: a poll started earlier
        (on_mount) could deliver its snapshot before the panels' children exist.
        """
        from opsctl.engine import lifetime

        if lifetime.received() is not None:  # a stop signal came while the app started
            self.exit()
            return
        self._poll()

    def _poll(self) -> None:
        self.run_worker(self._collect, thread=True, group="collect", exclusive=True)

    def _collect(self) -> None:
        try:
            snap = self.source()
        except StopIteration:
            return
        except Exception as exc:  # a failed poll is shown, then retried
            self.call_from_thread(self.notify, f"poll failed: {exc}", severity="error")
            self.call_from_thread(self.set_timer, self.interval, self._poll)
            return
        self.call_from_thread(self.show, snap)

    def show(self, snap: ServeSnapshot) -> None:
        """Render one snapshot, record it, apply ``until`` and arm the next poll."""
        self.last = snap
        self.polls += 1
        self.sub_title = f"{snap.model} — {snap.state}"
        try:
            for cls in PANELS:
                self.query_one(cls).update_snapshot(snap)
        except Exception as exc:  # a render failure is shown; the next poll still comes
            self.notify(f"render failed: {exc}", severity="error")
        if self.record is not None:
            with open(self.record, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(snap.to_dict(), default=str) + "\n")
        if self.until is not None:
            code = self.until(snap)
            if code is not None:
                self.result_code = code
                if code != 1:  # a dead engine stays on screen until the user quits
                    self.exit()
                    return
        self.set_timer(self.interval, self._poll)


def build_serve_app(
    source: Callable[[], ServeSnapshot], interval: float = 1.0, **kw
) -> ServeDashboard:
    """The serve dashboard over ``source``, polled every ``interval`` seconds."""
    return ServeDashboard(source, interval, **kw)


def replay_source(path: Path) -> Callable[[], ServeSnapshot]:
    """A source that replays recorded JSONL snapshots (then repeats the last one)."""
    from opsctl.serve.collect import from_dict

    snaps = [from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    state = {"i": 0}

    def source() -> ServeSnapshot:
        i = min(state["i"], len(snaps) - 1)
        state["i"] += 1
        return snaps[i]

    return source


def run_dashboard(
    server, timeout: float, run_app: Callable[[ServeDashboard], object] | None = None
) -> int:
    """Run the dashboard over a started EngineServer; 0 after the user quits a healthy server.

    Raises EngineDied (exit 1) if the engine died, OpsTimeout (exit 4) when it did not
    become healthy in time. ``run_app`` runs the app (default: in this terminal; tests
    drive it headless with Pilot).
    """
    import os

    from opsctl.errors import OpsTimeout
    from opsctl.serve import judge_state
    from opsctl.serve.collect import ServeCollector
    from opsctl.ui import runner

    collector = ServeCollector(server)
    record = os.environ.get("OPSCTL_RECORD_SNAPSHOTS")

    def until(snap: ServeSnapshot) -> int | None:
        if snap.state == judge_state.DEAD:
            return 1
        if (
            snap.state != judge_state.READY
            and server.healthy_at is None
            and time.time() - server.started_at > timeout
        ):
            return 4
        return None

    app = build_serve_app(collector.collect, record=Path(record) if record else None, until=until)
    try:
        # a stop signal exits the app and is raised here: the caller stops the server
        runner.run_app(app, run_app)
    finally:
        collector.stopping = True
        collector.close()
    if app.result_code == 4:
        raise OpsTimeout(
            f"server did not become healthy within {timeout:g} s", hint=f"log: {server.log_path}"
        )
    if app.result_code == 1:
        from opsctl.engine.supervise import died_error

        raise died_error(server)  # the rank that died first, else the log's decisive lines
    return 0
