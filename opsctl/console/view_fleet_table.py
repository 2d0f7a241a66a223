"""The console's fleet table (``FleetTable``): a Line API widget over a row model.

The model: per endpoint URL its cells (strings, ``opsctl.console.view_panel.row_cells``),
the row order (sorted by one column's key), the cursor. A tick updates the model and
repaints only the lines on screen whose text changed; an unchanged tick touches nothing,
a row off screen costs nothing until it is scrolled to, a column only ever grows (then
the window is repainted once), and sorting reorders the URL list (the lines whose row
moved are repainted). Each line is drawn straight into Segments from its cells: no Rich
renderable per cell, no render caches to invalidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from opsctl.console.columns import GPU, Row, has_gpus
from opsctl.console.judge import EndpointView
from opsctl.console.view_panel import COLUMNS, STATE_STYLE, row_cells
from opsctl.domain.gpu import HostGpus


def sort_value(cell: str):
    """Numbers sort as numbers, '-' last, text as text."""
    head = cell.split(" ", 1)[0]
    try:
        return (0, float(head), "")
    except ValueError:
        return (1 if cell not in ("-", "", "…") else 2, 0.0, cell.lower())


# the cells drawn in a style of their own (the rest take the row's style)
_STATE_STYLES = {state: Style.parse(style) for state, style in STATE_STYLE.items()}
_RED, _GREEN, _YELLOW = Style.parse("red"), Style.parse("green"), Style.parse("yellow")


def cell_style(key: str, value: str) -> Style | None:
    """The style of one cell's text, or None for the row's own."""
    if key == "state":
        return _STATE_STYLES.get(value)
    if key == "age" and value:
        return _YELLOW
    if key == "check" and value:
        if "FAIL" in value or "ERROR" in value:
            return _RED
        return _GREEN if "PASS" in value else _YELLOW
    return None


def one_line(value: str) -> str:
    """A cell is one line on screen (a reason from a server may hold a newline)."""
    return value if "\n" not in value else value.replace("\n", " ")


@dataclass(slots=True)
class Column:
    """One column of the fleet table: its key, its label and the width it has grown to."""

    key: str
    label: Text
    # the widest of its label and every cell it has shown (display cells): the one
    # record of a column's width; it only grows (FleetTable._grow)
    content_width: int

    @property
    def width(self) -> int:
        """Drawn width: the content and one cell of padding on each side."""
        return self.content_width + 2


class FleetTable(ScrollView, can_focus=True):
    """One row per endpoint, keyed by URL; ``show`` repaints only the changed rows on screen.

    A fixed header line; a row cursor that stays on its endpoint when the rows move (so an
    action never lands on the endpoint that a re-sort slid under it); Enter or a click on
    the cursor's row posts ``RowSelected`` (the app drills in); a click on a header sorts by
    that column.
    """

    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"fleet-table--header", "fleet-table--cursor"}
    # the look of Textual's DataTable (this widget replaced one): same colours and styles
    DEFAULT_CSS = """
    FleetTable {
        background: $surface;
        color: $foreground;
        height: 1fr;
        max-height: 100%;
        &:focus {
            background-tint: $foreground 5%;
            & > .fleet-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
            & > .fleet-table--header { background-tint: $foreground 5%; }
        }
        & > .fleet-table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .fleet-table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .fleet-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
    }
    """
    BINDINGS = [
        Binding("enter", "select_cursor", "Select", show=False),  # -> RowSelected
        Binding("up", "cursor_up", "Cursor up", show=False),
        Binding("down", "cursor_down", "Cursor down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home,ctrl+home", "first", "First row", show=False),
        Binding("end,ctrl+end", "last", "Last row", show=False),
    ]

    class RowSelected(Message):
        """A row chosen: Enter, or a click on the cursor's row (the app drills in)."""

        def __init__(self, table: FleetTable, url: str) -> None:
            super().__init__()
            self.table = table
            self.url = url

        @property
        def control(self) -> FleetTable:
            """The table the row was chosen in."""
            return self.table

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.columns: dict[str, Column] = {
            key: Column(key, Text(label), cell_len(label)) for key, label in COLUMNS
        }
        self.cells: dict[str, tuple[str, ...]] = {}  # per URL, its COLUMNS cells
        self.order: list[str] = []  # the URLs as shown, top to bottom
        self._index: dict[str, int] = {}  # URL -> its row in ``order``
        self._sort_keys: dict[str, tuple] = {}  # per URL, its sort column's key
        self.sort_col: str | None = "name"
        self.sort_reverse = False
        self.cursor_row = 0
        # the GPU column joins (last) once the host is seen to have a GPU
        self.host_gpus: HostGpus | None = None
        self.gpu_cells: dict[str, str] | None = None
        # what the tests and the benchmark read: cells written, lines drawn, reorders
        self.renders = 0
        self.painted = 0
        self.sorts = 0

    # ---- the row model -------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        """The number of rows (endpoints shown)."""
        return len(self.order)

    def _row(self, url: str) -> tuple[str, ...]:
        if self.gpu_cells is None:
            return self.cells[url]
        return (*self.cells[url], self.gpu_cells.get(url, ""))

    def get_row(self, url: str) -> list[str]:
        """The cells of ``url``'s row (the GPU cell last when that column is on)."""
        return list(self._row(url))

    def get_row_at(self, index: int) -> list[str]:
        """The cells of the row at ``index``."""
        return list(self._row(self.order[index]))

    def get_row_index(self, url: str) -> int:
        """The row index of ``url``."""
        return self._index[url]

    def get_cell(self, url: str, key: str) -> str:
        """The cell of ``url``'s row in column ``key``."""
        return self._row(url)[list(self.columns).index(key)]

    def selected_url(self) -> str | None:
        """The URL of the row under the cursor, or None when there are no rows."""
        return self.order[self.cursor_row] if 0 <= self.cursor_row < len(self.order) else None

    def show(
        self,
        views: list[EndpointView],
        now: float,
        interval: float,
        notes: dict[str, str] | None = None,
    ) -> None:
        """``notes``: per URL, the text of the "check" column (a check's result)."""
        notes = notes or {}
        wanted = {
            v.target.url: row_cells(v, now, interval, notes.get(v.target.url, "")) for v in views
        }
        cells = self.cells
        removed = [u for u in cells if u not in wanted]
        for url in removed:
            del cells[url]
            self._sort_keys.pop(url, None)
            if self.gpu_cells is not None:
                self.gpu_cells.pop(url, None)  # drawn afresh if it comes back
        added = False
        grew = False
        changed: set[str] = set()
        keys = [k for k, _ in COLUMNS]
        for url, row in wanted.items():
            old = cells.get(url)
            if old is None:
                for key, c in zip(keys, row, strict=True):
                    grew = self._grow(key, c) or grew
                self.renders += len(row)
                added = True
            elif old != row:
                for key, a, b in zip(keys, old, row, strict=True):
                    if a != b:
                        grew = self._grow(key, b) or grew
                        self.renders += 1
                changed.add(url)
            else:
                continue
            cells[url] = row
        grew = self._show_gpus(views, changed, Row(now, interval, host=self.host_gpus)) or grew
        self._place(bool(removed) or added, changed, grew)

    def _show_gpus(self, views: list[EndpointView], changed: set[str], row: Row) -> bool:
        """The GPU cells; whether the column was added or grew."""
        grew = False
        if self.gpu_cells is None:
            if not has_gpus(row.host):
                return False
            self.columns[GPU.key] = Column(GPU.key, Text(GPU.header), cell_len(GPU.header))
            self.gpu_cells = {}
            grew = True
        gpu = self.gpu_cells
        for v in views:
            url = v.target.url
            cell = GPU.cell(v, row)
            if gpu.get(url) != cell:
                grew = self._grow(GPU.key, cell) or grew
                gpu[url] = cell
                changed.add(url)
                self.renders += 1
        return grew

    def _grow(self, key: str, value: str) -> bool:
        """Whether ``value`` is wider (in display cells) than its column's label and every
        cell the column has shown: then the column grows to it (every line is drawn
        again). A narrower or same-width cell leaves the width as it is and costs nothing."""
        column = self.columns.get(key)
        if column is None:
            return False
        width = cell_len(one_line(value))
        if width <= column.content_width:
            return False
        column.content_width = width
        return True

    def _place(self, structural: bool, changed: set[str], grew: bool, scroll: bool = False) -> None:
        """Put the model on screen: the order (re-sorted only when a row came or went or
        a sort cell changed), the cursor (kept on its endpoint), the lines to repaint."""
        old = self.order
        selected = self.selected_url()
        resort = structural
        pos = list(self.columns).index(self.sort_col) if self.sort_col in self.columns else None
        if pos is not None:
            sort_keys = self._sort_keys
            for url in self.cells if structural else changed:
                k = sort_value(self._row(url)[pos])
                if sort_keys.get(url) != k:
                    sort_keys[url] = k
                    resort = True
        lines: set[int] = set()
        if resort:
            new = list(self.cells)  # arrival order: ties keep it, in both directions
            if pos is not None:
                new.sort(key=self._sort_keys.__getitem__, reverse=self.sort_reverse)
            if new != old:
                self.sorts += 1
                self.order = new
                self._index = {u: i for i, u in enumerate(new)}
                top, rows = self._window()
                for i in range(top, top + rows):  # the lines whose row moved
                    if (old[i] if i < len(old) else None) != (new[i] if i < len(new) else None):
                        lines.add(i)
        n = len(self.order)
        cursor = self._index.get(selected, self.cursor_row) if selected else self.cursor_row
        cursor = max(0, min(cursor, n - 1))
        if cursor != self.cursor_row:
            lines.update((self.cursor_row, cursor))
            self.cursor_row = cursor
        size = Size(sum(c.width for c in self.columns.values()), n + 1)
        if size != self.virtual_size:
            self.virtual_size = size
        if scroll:
            self._scroll_to_cursor()
        if grew:  # the columns moved: every line on screen is drawn again
            self.refresh()
            return
        lines.update(self._index[u] for u in changed)
        self._refresh_rows(lines)

    def _window(self) -> tuple[int, int]:
        """The first row on screen and how many rows fit (the header line apart)."""
        return self.scroll_offset.y, max(0, self.scrollable_content_region.height - 1)

    def _refresh_rows(self, rows: set[int]) -> None:
        top, count = self._window()
        width = self.size.width
        regions = [Region(0, i - top + 1, width, 1) for i in rows if top <= i < top + count]
        if regions:
            self.refresh(*regions)

    # ---- sorting and the cursor ----------------------------------------------------------
    def apply_sort(self) -> None:
        """Re-sort the rows by the sort column and keep the cursor's endpoint in view."""
        self._place(True, set(), False, scroll=True)

    def sort_by(self, key: str) -> None:
        """Sort by column ``key`` (ascending; the same column again reverses the order)."""
        self.sort_reverse = not self.sort_reverse if key == self.sort_col else False
        self.sort_col = key
        self.apply_sort()

    def move_cursor(
        self, *, row: int | None = None, column: int | None = None, animate: bool = False,
        scroll: bool = True,
    ) -> None:  # fmt: skip
        """DataTable's signature (``column`` is ignored: the cursor is a row)."""
        if row is None:
            return
        row = max(0, min(row, len(self.order) - 1))
        if row != self.cursor_row:
            self._refresh_rows({self.cursor_row, row})
            self.cursor_row = row
        if scroll:
            self._scroll_to_cursor(animate)

    def _scroll_to_cursor(self, animate: bool = False) -> None:
        top, rows = self._window()
        row = self.cursor_row
        if row < top:
            target = row
        elif row >= top + rows:
            target = row - max(rows, 1) + 1
        else:
            return
        self.scroll_to(y=target, animate=animate, force=True)
        if self.scroll_offset.y != target and not animate:  # not laid out yet: after it
            self.call_after_refresh(self.scroll_to, y=target, animate=False, force=True)

    def action_cursor_up(self) -> None:
        """Move the cursor one row up."""
        self.move_cursor(row=self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        """Move the cursor one row down."""
        self.move_cursor(row=self.cursor_row + 1)

    def action_page_up(self) -> None:
        """Move the cursor one window up."""
        self.move_cursor(row=self.cursor_row - max(1, self._window()[1]))

    def action_page_down(self) -> None:
        """Move the cursor one window down."""
        self.move_cursor(row=self.cursor_row + max(1, self._window()[1]))

    def action_select_cursor(self) -> None:
        """Post RowSelected for the cursor's row (Enter)."""
        url = self.selected_url()
        if url is not None:
            self.post_message(self.RowSelected(self, url))

    def action_first(self) -> None:
        """Move the cursor to the first row."""
        self.move_cursor(row=0)

    def action_last(self) -> None:
        """Move the cursor to the last row."""
        self.move_cursor(row=len(self.order) - 1)

    def on_click(self, event: events.Click) -> None:
        """A click: a header sorts by its column; a row gets the cursor (or is selected)."""
        offset = event.get_content_offset(self)
        if offset is None:
            return
        event.stop()
        if offset.y == 0:  # the header: sort by the column clicked
            x = offset.x + self.scroll_offset.x
            for key, column in self.columns.items():
                if x < column.width:
                    self.sort_by(key)
                    return
                x -= column.width
            return
        row = offset.y - 1 + self.scroll_offset.y
        if row >= len(self.order):
            return
        if row == self.cursor_row:
            self.post_message(self.RowSelected(self, self.order[row]))
        else:
            self.move_cursor(row=row)

    def notify_style_update(self) -> None:
        """Repaint all: focus or theme changed the cursor's and the header's styles."""
        super().notify_style_update()
        self.refresh()  # focus, theme: the cursor's and the header's styles changed

    # ---- drawing -------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the window: the header, or the row at ``y - 1`` below the top."""
        self.painted += 1
        width = self.size.width
        base = self.rich_style
        scroll_x, scroll_y = self.scroll_offset
        if y == 0:
            header = self.get_component_styles("fleet-table--header").rich_style
            segments = self._header_segments(header, width)
        else:
            row = y - 1 + scroll_y
            if row >= len(self.order):
                return Strip.blank(width, base)
            url = self.order[row]
            segments = self._row_segments(self._row(url), row == self.cursor_row, base, width)
        strip = Strip(segments)
        if scroll_x or strip.cell_length > width:
            strip = strip.crop(scroll_x, scroll_x + width)
        return strip.adjust_cell_length(width, base)

    def _header_segments(self, style: Style, width: int) -> list[Segment]:
        out = []
        used = 0
        for column in self.columns.values():
            label = column.label.plain
            out.append(
                Segment(f" {label}{' ' * (column.content_width - cell_len(label) + 1)}", style)
            )
            used += column.width
        if width > used:
            out.append(Segment(" " * (width - used), style))
        return out

    def _row_segments(
        self, cells: tuple[str, ...], cursor: bool, base: Style, width: int
    ) -> list[Segment]:
        """One row: each cell padded to its column, in the row's style; a styled cell's
        text in its own style too. The cursor's colour wins over a cell's (as DataTable)."""
        if cursor:
            cursor_style = self.get_component_rich_style("fleet-table--cursor")
            pre = base + cursor_style
            post = Style.from_color(color=cursor_style.color)
            plain = pre + post
        else:
            pre = plain = base
            post = None
        out = []
        used = 0
        for column, value in zip(self.columns.values(), cells, strict=True):
            text = one_line(value)
            pad = " " * (column.content_width - cell_len(text) + 1)
            style = cell_style(column.key, text)
            if style is None:
                out.append(Segment(f" {text}{pad}", plain))
            else:
                text_style = pre + style + post if post else pre + style
                out += (Segment(" ", plain), Segment(text, text_style), Segment(pad, plain))
            used += column.width
        if width > used:
            out.append(Segment(" " * (width - used), pre))
        return out
