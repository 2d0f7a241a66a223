"""FleetTable draws only what changed and what is visible (issue 26 item 5): an unchanged
tick touches nothing, a changed cell is written in place and only its row is repainted
(what the user sees is the new text), an off-screen row costs no rendering until it is
scrolled to, a wider cell still widens its column, and a tick that keeps the order does
not re-sort. A real Textual app (headless), real DataTable rendering; the views are the
domain's own EndpointView (figures left empty: the "restarts" column carries the change)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.app import App, ComposeResult

from opsctl.domain import console as c
from opsctl.domain.console_state import EndpointTracker, Settings
from opsctl.ui.console_app import build_console_app
from opsctl.ui.panels.console import COLUMNS, FleetTable
from tests.standin_vllm import MODES

RESTARTS_COL = [k for k, _ in COLUMNS].index("restarts")


def views(n: int, restarts: dict[int, int] | None = None) -> list[c.EndpointView]:
    restarts = restarts or {}
    out = []
    for i in range(n):
        target = c.Target(f"node-{i:03d}", f"http://10.0.{i // 250}.{i % 250 + 1}:8000", "targets")
        base = EndpointTracker(target, Settings(interval_s=1.0)).view
        out.append(replace(base, restarts=restarts.get(i, 0)))
    return out


class TableApp(App):
    def compose(self) -> ComposeResult:
        yield FleetTable(id="fleet")


class Counting:
    """Counts a table's update_cell, refresh and sort calls (wrapping the real ones) and
    the cells it rendered afresh (entries added to DataTable's cell render cache)."""

    def __init__(self, table: FleetTable) -> None:
        self.update_cell = self.refresh = self.sort = 0
        self.table = table
        self.cached = self._cache()
        for name in ("update_cell", "refresh", "sort"):
            real = getattr(table, name)
            setattr(table, name, self._counted(name, real))

    def _counted(self, name, real):
        def call(*a, **kw):
            setattr(self, name, getattr(self, name) + 1)
            return real(*a, **kw)

        return call

    def _cache(self) -> dict:
        cache = self.table._cell_render_cache
        return {k: cache.get(k) for k in list(cache.keys())}  # a render is a new object

    @property
    def rendered(self) -> list[tuple[str, str]]:
        """(row, column) of each cell rendered since this counter was made."""
        now = self._cache()
        keys = [k for k, v in now.items() if self.cached.get(k) is not v]
        return sorted((k[0].value, k[1].value) for k in keys if k[0].value is not None)


async def settle(pilot, table: FleetTable) -> None:
    """Until DataTable's deferred work (measuring new rows, done when the app is idle)
    is done: on a busy host it can land after a first pause, and it refreshes."""
    from tests.ui.test_console_app import wait_for

    await wait_for(
        pilot,
        lambda: not table._require_update_dimensions and not table._updated_cells,
        what="the table's layout",
    )
    await pilot.pause()


def screen_text(table: FleetTable) -> str:
    """The table's lines as the compositor gets them: through the widget's own cache of
    painted lines, which keeps a line until its region is refreshed (a changed row that
    was not repainted would show its old text here)."""
    return "\n".join(strip.text for strip in table.render_lines(table.size.region))


@pytest.mark.anyio
async def test_an_unchanged_tick_touches_nothing_and_a_changed_cell_is_redrawn_alone() -> None:
    app = TableApp()
    async with app.run_test(size=(200, 30)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(10), 1000.0, 1.0)
        await settle(pilot, table)
        count = Counting(table)
        renders, updates = table.renders, table._update_count
        for _ in range(3):
            table.show(views(10), 1000.0, 1.0)
            await pilot.pause()
        assert (count.update_cell, count.refresh, count.sort, table.renders) == (0, 0, 0, renders)
        assert table._update_count == updates and count.rendered == []

        table.show(views(10, {3: 7}), 1000.0, 1.0)  # one cell, same width
        await pilot.pause()
        assert table.renders == renders + 1
        assert count.update_cell == 0 and table._update_count == updates  # written in place
        assert count.rendered == [("http://10.0.0.4:8000", "restarts")]  # that cell alone
        assert str(table.get_cell("http://10.0.0.4:8000", "restarts")) == "7"
        line = next(ln for ln in screen_text(table).splitlines() if "node-003" in ln)
        assert line.split()[0] == "node-003" and " 7 " in line
        others = [ln for ln in screen_text(table).splitlines() if "node-00" in ln]
        assert len(others) == 10 and all(" 0 " in ln for ln in others if "node-003" not in ln)


@pytest.mark.anyio
async def test_off_screen_rows_cost_nothing_until_shown_and_wider_cells_widen() -> None:
    app = TableApp()
    async with app.run_test(size=(200, 20)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(100), 1000.0, 1.0)
        await settle(pilot, table)
        count = Counting(table)
        table.show(views(100, {90: 5}), 1000.0, 1.0)  # far below the window
        await pilot.pause()
        assert count.refresh == 0 and count.rendered == []
        assert "node-090" not in screen_text(table)
        table.move_cursor(row=90)  # scroll to it: drawn with its new value
        await pilot.pause()
        line = next(ln for ln in screen_text(table).splitlines() if "node-090" in ln)
        assert " 5 " in line

        table.show(views(100, {90: 12345}), 1000.0, 1.0)  # wider: the column grows
        await pilot.pause()
        line = next(ln for ln in screen_text(table).splitlines() if "node-090" in ln)
        assert " 12345 " in line
        assert table.columns[table._column_locations.get_key(RESTARTS_COL)].content_width >= 5


@pytest.mark.anyio
async def test_a_tick_that_keeps_the_order_does_not_sort_one_that_changes_it_does() -> None:
    app = TableApp()
    async with app.run_test(size=(200, 30)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(5, {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}), 1000.0, 1.0)
        table.sort_by("restarts")
        await settle(pilot, table)
        count = Counting(table)
        table.show(views(5, {0: 1, 1: 2, 2: 3, 3: 4, 4: 6}), 1000.0, 1.0)  # same order
        await pilot.pause()
        assert count.sort == 0
        table.show(views(5, {0: 9, 1: 2, 2: 3, 3: 4, 4: 6}), 1000.0, 1.0)  # node-000 last
        await pilot.pause()
        assert count.sort == 1
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert names == ["node-001", "node-002", "node-003", "node-004", "node-000"]


@pytest.mark.anyio
async def test_the_console_app_draws_nothing_on_an_unchanged_tick_and_coalesces_asked_ones():
    from tests.ui.test_console_app import StaticSource, wait_for

    app = build_console_app(StaticSource(), interval=3600)  # ticks only when asked here
    async with app.run_test(size=(200, 30)) as pilot:
        await wait_for(pilot, lambda: app.table.row_count == len(MODES))
        await settle(pilot, app.table)
        count = Counting(app.table)
        header_updates = []
        real_update = app.header.update
        app.header.update = lambda *a, **kw: header_updates.append(a) or real_update(*a, **kw)
        for _ in range(3):
            app.tick()
            await pilot.pause()
        seen = (count.update_cell, count.refresh, count.sort, header_updates, count.rendered)
        assert seen == (0, 0, 0, [], [])
        ticks = app.ticks
        for _ in range(5):  # e.g. five filter keys before the app gets to draw
            app.ask_tick()
        await pilot.pause()
        await pilot.pause()
        assert app.ticks == ticks + 1
