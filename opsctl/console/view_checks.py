"""The checks run from the console: a table of jobs and the live DiagPanel of the one selected.

The table shows check, endpoint, state, verdict and first finding; the panel of the job
under the cursor is fed by its events. The panel of another job is rebuilt from that
job's recorded snapshots.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from opsctl.console.actions import CheckJob
from opsctl.ui.panels.diag import DiagPanel

JOB_COLUMNS = ("#", "check", "endpoint", "state", "verdict", "first finding / error")


def job_cells(j: CheckJob) -> tuple[str, ...]:
    """A job's row: id, check, endpoint, state (or running phase), verdict, finding or error."""
    return (
        str(j.id),
        j.check.name,
        j.endpoint,
        j.state if not j.running else f"running: {j.phase}",
        (j.verdict or "-").upper(),
        (j.finding or j.error or "")[:100],
    )


class ChecksScreen(Screen):
    """The jobs table above the selected job's DiagPanel; K cancels that job, Esc goes back."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("K", "cancel_job", "Cancel check"),
    ]
    DEFAULT_CSS = """
    ChecksScreen #jobs { height: auto; max-height: 10; }
    ChecksScreen #jobs-title { height: 1; padding: 0 1; }
    """

    def __init__(self, jobs: list[CheckJob], show: int | None = None) -> None:
        super().__init__()
        self.jobs = jobs
        self.shown: int | None = show if show is not None else (jobs[-1].id if jobs else None)
        self.ready = False  # the panel is mounted and holds the shown job's snapshots

    def compose(self) -> ComposeResult:
        """Title line, the jobs table, the shown job's panel, footer."""
        yield Static("checks run from this console (Esc back, K cancel)", id="jobs-title")
        yield DataTable(id="jobs", cursor_type="row")
        yield DiagPanel(self._title(), id="check-panel")
        yield Footer()

    def _title(self) -> str:
        job = self.job(self.shown)
        return f"{job.check.title} on {job.endpoint}" if job else "no check yet"

    def job(self, job_id: int | None) -> CheckJob | None:
        """The job with ``job_id``, or None."""
        return next((j for j in self.jobs if j.id == job_id), None)

    def on_mount(self) -> None:
        """Columns, the jobs' rows and the shown job's panel replayed from its snapshots."""
        table = self.query_one("#jobs", DataTable)
        for key in JOB_COLUMNS:
            table.add_column(key, key=key)
        self.refresh_jobs()
        self._replay()
        self.ready = True

    def refresh_jobs(self) -> None:
        """Add new jobs' rows, update the others' cells and keep the cursor on the shown job."""
        table = self.query_one("#jobs", DataTable)
        for j in self.jobs:
            key = str(j.id)
            cells = job_cells(j)
            if key not in table.rows:
                table.add_row(*cells, key=key)
            else:
                for col, value in zip(JOB_COLUMNS, cells, strict=True):
                    table.update_cell(key, col, value, update_width=True)
        if self.shown is not None and str(self.shown) in table.rows:
            table.move_cursor(row=table.get_row_index(str(self.shown)))

    def _replay(self) -> None:
        job = self.job(self.shown)
        panel = self.query_one(DiagPanel)
        for snap in list(job.snapshots) if job else []:
            panel.update_snapshot(snap)

    def on_job_event(self, job: CheckJob, snap: dict) -> None:
        """A job's new snapshot (called by the app on the UI thread).

        Before the panel is ready the snapshot is skipped: the replay of the job's snapshots
        brings it. A snapshot arriving while the screen is being taken down (the app exiting, the
        panel being swapped) is dropped: a late event never kills the console.
        """
        if not self.ready or not self.is_attached:
            return
        try:
            self.refresh_jobs()
            if job.id == self.shown:
                self.query_one(DiagPanel).update_snapshot(snap)
        except NoMatches:
            return

    async def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """Another job under the cursor: swap in a new panel replayed from its snapshots."""
        if event.cursor_row != event.data_table.cursor_row:
            # stale: the cursor moved on since it was posted (on mount, the first row's
            # highlight can arrive after the cursor went to the job asked for, `show`)
            return
        job_id = int(event.row_key.value or 0)
        if job_id == self.shown:
            return
        self.shown = job_id
        self.ready = False
        await self.query_one(DiagPanel).remove()
        await self.mount(DiagPanel(self._title(), id="check-panel"), before=self.query_one(Footer))
        self._replay()
        self.ready = True

    def action_cancel_job(self) -> None:
        """Cancel the shown job if it runs (at its next step)."""
        job = self.job(self.shown)
        if job is not None and job.running:
            job.cancelled.set()
            self.notify(f"cancelling {job.check.title} on {job.endpoint} (at its next step)")
