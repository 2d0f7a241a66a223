"""FleetTable draws only what changed and what is visible (issue 26 item 5): an unchanged
tick paints nothing, a changed cell repaints its row's line alone (what the user sees
is the new text), a row off screen costs nothing until it is scrolled to, a wider cell
widens its column (the window is repainted once), a tick that keeps the order does not
reorder, and the cursor stays on its endpoint when rows move. A real Textual app
(headless) painting through its compositor; the lines painted are counted where the
compositor asks for them (``render_line``). The views are the domain's own EndpointView
(figures left empty: the "restarts" column carries the change)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.app import App, ComposeResult

from opsctl.console import judge as c
from opsctl.console.judge_state import EndpointTracker, Settings
from opsctl.console.view_app import build_console_app
from opsctl.console.view_fleet_table import FleetTable
from tests.standins.vllm_server import MODES


def url(i: int) -> str:
    return f"http://10.0.{i // 250}.{i % 250 + 1}:8000"


def views(n: int, restarts: dict[int, int] | None = None) -> list[c.EndpointView]:
    restarts = restarts or {}
    out = []
    for i in range(n):
        target = c.Target(f"node-{i:03d}", url(i), "targets")
        base = EndpointTracker(target, Settings(interval_s=1.0)).view
        out.append(replace(base, restarts=restarts.get(i, 0)))
    return out


class TableApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []

    def compose(self) -> ComposeResult:
        yield FleetTable(id="fleet")

    def on_fleet_table_row_selected(self, event: FleetTable.RowSelected) -> None:
        self.selected.append(event.url)


class Counting:
    """Counts a table's refresh calls and the lines the compositor had it paint (its
    ``render_line`` calls: the row each painted, "header" for the header line)."""

    def __init__(self, table: FleetTable) -> None:
        self.refresh = 0
        self.lines: list[str | None] = []
        real_refresh, real_line = table.refresh, table.render_line

        def refresh(*regions, **kw):
            self.refresh += 1
            return real_refresh(*regions, **kw)

        def render_line(y: int):
            row = y - 1 + table.scroll_offset.y
            name = None if row >= table.row_count else table.get_row_at(row)[0]
            self.lines.append("header" if y == 0 else name)
            return real_line(y)

        table.refresh, table.render_line = refresh, render_line


async def settle(pilot, table: FleetTable) -> None:
    """Until what the table asked to repaint has been painted (the compositor's update
    runs on a timer; a busy host can leave it pending after one pause)."""
    from tests.ui.test_console_app import wait_for

    screen = table.screen
    await pilot.pause()
    await wait_for(
        pilot,
        lambda: (
            not table._repaint_required
            and not table._repaint_regions
            and table not in screen._dirty_widgets
        ),
        what="the table's repaint",
    )


def screen_text(table: FleetTable) -> str:
    """The table's lines as the compositor gets them: through the widget's cache of
    painted lines, which keeps a line until its region is refreshed (a changed row that
    was not repainted would show its old text here)."""
    return "\n".join(strip.text for strip in table.render_lines(table.size.region))


@pytest.mark.anyio
async def test_an_unchanged_tick_paints_nothing_and_a_changed_cell_repaints_its_row_alone():
    app = TableApp()
    async with app.run_test(size=(200, 30)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(10), 1000.0, 1.0)
        await settle(pilot, table)
        assert table.painted >= 11  # header and 10 rows were drawn once
        count = Counting(table)
        renders, sorts = table.renders, table.sorts
        for _ in range(3):
            table.show(views(10), 1000.0, 1.0)
            await settle(pilot, table)
        assert (count.refresh, count.lines, table.renders, table.sorts) == (0, [], renders, sorts)

        table.show(views(10, {3: 7}), 1000.0, 1.0)  # one cell, same width
        await settle(pilot, table)
        assert table.renders == renders + 1 and table.sorts == sorts
        assert count.refresh == 1 and count.lines == ["node-003"]  # that row's line alone
        assert table.get_cell(url(3), "restarts") == "7"
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
        renders = table.renders
        table.show(views(100, {90: 5}), 1000.0, 1.0)  # far below the window
        await settle(pilot, table)
        assert table.renders == renders + 1  # in the model...
        assert count.refresh == 0 and count.lines == []  # ...and nothing painted
        assert "node-090" not in screen_text(table)
        table.move_cursor(row=90)  # scroll to it: drawn with its new value
        await settle(pilot, table)
        assert "node-090" in count.lines and "node-000" not in count.lines
        line = next(ln for ln in screen_text(table).splitlines() if "node-090" in ln)
        assert " 5 " in line and table.selected_url() == url(90)

        count.lines.clear()
        assert table.columns["restarts"].content_width == len("restarts")
        table.show(views(100, {90: 123456789}), 1000.0, 1.0)  # wider than the header
        await settle(pilot, table)
        assert table.columns["restarts"].content_width == 9
        window = table.scrollable_content_region.height  # every line moved: all repainted
        assert len(count.lines) == window and count.lines[0] == "header"
        text = screen_text(table).splitlines()
        line = next(ln for ln in text if "node-090" in ln)
        assert " 123456789 " in line
        assert text[0].index("age") == line.index("123456789") + 9 + 2  # the next column moved


@pytest.mark.anyio
async def test_a_tick_that_keeps_the_order_does_not_reorder_and_the_cursor_follows_its_row():
    app = TableApp()
    async with app.run_test(size=(200, 30)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(5, {0: 1, 1: 2, 2: 3, 3: 4, 4: 5}), 1000.0, 1.0)
        table.sort_by("restarts")
        await settle(pilot, table)
        count = Counting(table)
        sorts = table.sorts
        assert table.selected_url() == url(0)
        table.show(views(5, {0: 1, 1: 2, 2: 3, 3: 4, 4: 6}), 1000.0, 1.0)  # same order
        await settle(pilot, table)
        assert table.sorts == sorts and count.lines == ["node-004"]
        table.show(views(5, {0: 9, 1: 2, 2: 3, 3: 4, 4: 6}), 1000.0, 1.0)  # node-000 last
        await settle(pilot, table)
        assert table.sorts == sorts + 1
        names = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert names == ["node-001", "node-002", "node-003", "node-004", "node-000"]
        assert sorted(count.lines[1:]) == sorted(names)  # every row moved: all repainted
        assert table.selected_url() == url(0) and table.cursor_row == 4  # kept its endpoint
        text = screen_text(table).splitlines()
        assert [ln.split()[0] for ln in text[1:6]] == names
        table.sort_by("restarts")  # again: reversed
        assert [table.get_row_at(i)[0] for i in range(5)] == names[::-1]


@pytest.mark.anyio
async def test_keys_and_clicks_move_the_cursor_sort_and_select() -> None:
    from tests.ui.test_console_app import wait_for

    app = TableApp()
    async with app.run_test(size=(200, 12)) as pilot:
        table = app.query_one(FleetTable)
        table.show(views(40, {i: 100 - i for i in range(40)}), 1000.0, 1.0)  # 100 .. 61
        await settle(pilot, table)
        await pilot.press("down", "down")
        assert table.selected_url() == url(2)
        await pilot.press("end")  # the last row, scrolled into view
        await settle(pilot, table)
        assert table.cursor_row == 39 and "node-039" in screen_text(table)
        await pilot.press("home", "pagedown")
        await settle(pilot, table)
        row = table.cursor_row
        assert 0 < row < 39 and f"node-{row:03d}" in screen_text(table)
        await pilot.press("enter")  # the app drills in on this message
        await wait_for(pilot, lambda: app.selected == [url(row)], what="the selection")
        header = screen_text(table).splitlines()[0]
        await pilot.click(FleetTable, offset=(header.index("restarts") + 2, 0))
        await wait_for(pilot, lambda: table.sort_col == "restarts", what="the header click")
        assert table.get_row_at(0)[0] == "node-039"  # 61 restarts first
        assert table.selected_url() == url(row)  # the cursor kept its endpoint
        await pilot.press("home")
        await settle(pilot, table)
        await pilot.click(FleetTable, offset=(2, 3))  # the third row: the cursor moves there
        await wait_for(pilot, lambda: table.cursor_row == 2, what="the row click")
        assert len(app.selected) == 1
        await pilot.click(FleetTable, offset=(2, 3))  # the cursor's row: selected
        await wait_for(pilot, lambda: len(app.selected) == 2, what="the second click")
        assert app.selected[1] == url(37)  # node-037: 63 restarts, third


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
            await settle(pilot, app.table)
        assert (count.refresh, count.lines, header_updates) == (0, [], [])
        ticks = app.ticks
        for _ in range(5):  # e.g. five filter keys before the app gets to draw
            app.ask_tick()
        await pilot.pause()
        await pilot.pause()
        assert app.ticks == ticks + 1
