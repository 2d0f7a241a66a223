"""The console's fleet view: a header line with counts by state and a sortable,
filterable table, one row per endpoint. Only cells that changed are re-rendered."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey, RowKey

from opsctl.domain.advisor import findings as advisor_findings
from opsctl.domain.advisor import reason_cell
from opsctl.domain.alert_rules import alerts_cell
from opsctl.domain.console import EndpointView, FleetSnapshot
from opsctl.domain.console_state import state_counts
from opsctl.domain.gpu import HostGpus
from opsctl.domain.gpu import row_cell as gpu_row_cell
from opsctl.domain.requests import row_cell as tee_cell

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
# (key, header) of the fleet table, in order
COLUMNS = (
    ("name", "name"),
    ("state", "state"),
    ("model", "model"),
    ("source", "source"),
    ("running", "run"),
    ("waiting", "wait"),
    ("kv", "KV %"),
    ("gen", "gen tok/s"),
    ("prompt", "prompt tok/s"),
    ("ttft50", "TTFT p50"),
    ("ttft95", "TTFT p95"),
    ("hit", "prefix hit"),
    ("restarts", "restarts"),
    ("age", "age"),
    ("check", "check"),
    ("url", "url"),
    ("reason", "reason"),
)


def fmt(v: float | None, spec: str = ".1f", scale: float = 1.0, suffix: str = "") -> str:
    return "-" if v is None else f"{v * scale:{spec}}{suffix}"


def age_text(v: EndpointView, now: float, interval: float) -> str:
    """Empty while fresh; the data's age once it is older than 1.5 intervals."""
    age = v.age(now)
    if age is None:
        return "-" if v.scrapes else "…"
    return f"{age:.0f}s stale" if age > 1.5 * interval + 0.5 else ""


def row_cells(v: EndpointView, now: float, interval: float, note: str = "") -> tuple[str, ...]:
    f = v.figures
    ttft = f.latency.get("ttft")
    return (
        v.target.name,
        v.state,
        v.info.models[0].id if v.info.models else "-",
        v.target.source,
        fmt(f.running, ".0f") + tee_cell(v.requests),  # + in flight through --tee
        fmt(f.waiting, ".0f"),
        fmt(f.kv_usage, ".1f", 100),
        fmt(f.generation_tps),
        fmt(f.prompt_tps),
        fmt(ttft.p50 if ttft else None, ".0f", 1000, " ms"),
        fmt(ttft.p95 if ttft else None, ".0f", 1000, " ms"),
        fmt(f.prefix_hit_rate, ".0f", 100, " %"),
        str(v.restarts),
        age_text(v, now, interval),
        note[:60],
        v.target.url,
        alerts_cell(v.alerts) + reason_cell(v),  # Prometheus's alert, reason, top finding
    )


def sort_value(cell: str):
    """Numbers sort as numbers, '-' last, text as text."""
    head = cell.split(" ", 1)[0]
    try:
        return (0, float(head), "")
    except ValueError:
        return (1 if cell not in ("-", "", "…") else 2, 0.0, cell.lower())


def matches(v: EndpointView, text: str) -> bool:
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
    DEFAULT_CSS = "FleetHeader { height: auto; padding: 0 1; }"

    def show(self, text: Text) -> None:
        if getattr(self, "_last_plain", None) != (text.plain, str(text.spans)):
            self._last_plain = (text.plain, str(text.spans))
            self.update(text)


class FleetTable(DataTable):
    """Rows keyed by endpoint URL; ``show`` adds, removes and updates only what changed."""

    DEFAULT_CSS = "FleetTable { height: 1fr; }"

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self.cells: dict[str, tuple[str, ...]] = {}
        self.sort_col: str | None = "name"
        self.sort_reverse = False
        self.renders = 0  # cell updates done (tests and the benchmark read it)
        # per column, the widest cell it has shown: a column keeps its width unless a
        # wider cell appears (then DataTable measures it). A narrower cell costs nothing:
        # re-measuring a column re-renders every cell of it, and a relayout repaints the
        # whole table (19 % of the console's CPU at 64 endpoints, docs/console_perf.md)
        self.widths: dict[str, int] = {}
        # the GPU column joins (last) once the host is seen to have a GPU
        self.host_gpus: HostGpus | None = None
        self.gpu_cells: dict[str, str] | None = None

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def _styled(self, key: str, value: str) -> Text | str:
        if key == "state":
            return Text(value, style=STATE_STYLE.get(value, ""))
        if key == "age" and value:
            return Text(value, style="yellow")
        if key == "check" and value:
            style = (
                "red"
                if ("FAIL" in value or "ERROR" in value)
                else "green"
                if "PASS" in value
                else "yellow"
            )
            return Text(value, style=style)
        return value

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
        resort = False
        for url in [u for u in self.cells if u not in wanted]:
            self.remove_row(url)
            del self.cells[url]
        changed: dict[str, list[tuple[str, Text | str, bool]]] = {}
        for url, cells in wanted.items():
            old = self.cells.get(url)
            if old is None:
                self.add_row(
                    *(self._styled(k, c) for (k, _), c in zip(COLUMNS, cells, strict=True)), key=url
                )
                for (key, _), c in zip(COLUMNS, cells, strict=True):
                    self._width_changes(key, c)
                self.renders += len(cells)
                resort = True
            elif old != cells:
                for (key, _), a, b in zip(COLUMNS, old, cells, strict=True):
                    if a != b:
                        wider = self._width_changes(key, b)
                        changed.setdefault(url, []).append((key, self._styled(key, b), wider))
                        resort = resort or key == self.sort_col
            self.cells[url] = cells
        self._show_gpus(views, changed)
        self._apply(changed)
        if resort:
            self.apply_sort()

    def _apply(self, changed: dict[str, list[tuple[str, Text | str, bool]]]) -> None:
        """Put changed cells in place. DataTable's ``update_cell`` throws away every
        rendered line of the table (its caches are keyed by one update counter) and
        repaints the whole widget: at 64 changing rows that re-rendered every visible
        cell each tick (two thirds of the console's CPU, docs/console_perf.md). Here a
        cell whose column keeps its width is written in place, only its own cached render
        (and its row's line) is dropped, and only that row's region is repainted when on screen:
        unchanged rows and off-screen rows cost nothing. A column that must change width
        goes through ``update_cell`` (everything is re-laid out, as before)."""
        if not changed:
            return
        self.renders += sum(len(cells) for cells in changed.values())
        if any(wider for cells in changed.values() for _, _, wider in cells):
            for url, cells in changed.items():
                for key, value, wider in cells:
                    self.update_cell(url, key, value, update_width=wider)
            return
        rows = {RowKey(url) for url in changed}
        for url, cells in changed.items():
            data = self._data[RowKey(url)]
            for key, value, _ in cells:
                data[ColumnKey(key)] = value
        count = self._update_count
        indexes = {self._row_locations.get(r) for r in rows}
        keys = {(RowKey(url), ColumnKey(key)) for url, cs in changed.items() for key, _, _ in cs}
        cell_cache, row_cache = self._cell_render_cache, self._row_render_cache
        for ck in [k for k in cell_cache.keys() if k[:2] in keys]:  # noqa: SIM118 (LRUCache)
            cell_cache.discard(ck)  # the row's other cells keep their rendering
        for rk in [k for k in row_cache.keys() if k[0] in rows]:  # noqa: SIM118 (LRUCache)
            row_cache.discard(rk)
        renderables = self._row_renderable_cache
        for nk in [
            k
            for k in renderables.keys()  # noqa: SIM118 (an LRUCache)
            if k[0] == count and k[1] in indexes
        ]:
            renderables.discard(nk)
        offsets = self._y_offsets
        header = self.header_height if self.show_header else 0
        for lk in list(self._line_cache.keys()):
            y = lk[0] - header
            if 0 <= y < len(offsets) and offsets[y][0] in rows:
                self._line_cache.discard(lk)
        top = self.scroll_offset.y
        bottom = top + self.size.height
        for index in indexes:
            if index is not None and top <= index + header < bottom:
                self.refresh_row(index)

    def _show_gpus(
        self, views: list[EndpointView], changed: dict[str, list[tuple[str, Text | str, bool]]]
    ) -> None:
        host = self.host_gpus
        if self.gpu_cells is None:
            if host is None or not host.devices:
                return
            self.add_column("GPU", key="gpu", default="")
            self.gpu_cells = {}
        for url in [u for u in self.gpu_cells if u not in self.cells]:
            del self.gpu_cells[url]  # a removed row: drawn afresh if it comes back
        for v in views:
            cell = gpu_row_cell(v, host)
            if self.gpu_cells.get(v.target.url) != cell:
                wider = self._width_changes("gpu", cell)
                if v.target.url in self.gpu_cells:
                    changed.setdefault(v.target.url, []).append(("gpu", cell, wider))
                else:  # a row just added (or the column just added): written at once
                    self.update_cell(v.target.url, "gpu", cell, update_width=wider)
                    self.renders += 1
                self.gpu_cells[v.target.url] = cell

    def _width_changes(self, key: str, value: str) -> bool:
        """Whether ``value`` is wider than every cell its column has shown (recorded)."""
        width = cell_len(value)
        if width <= self.widths.get(key, 0):
            return False
        self.widths[key] = width
        return True

    def apply_sort(self) -> None:
        if self.sort_col is None or not self.cells:
            return
        keys = [k for k, _ in COLUMNS]
        if self.sort_col in keys:  # already in order (the usual tick): no re-layout
            i = keys.index(self.sort_col)
            now = [str(row.key.value) for row in self.ordered_rows]
            want = sorted(
                now, key=lambda u: sort_value(self.cells[u][i]), reverse=self.sort_reverse
            )
            if want == now:
                return
        self.sort(self.sort_col, key=lambda cell: sort_value(str(cell)), reverse=self.sort_reverse)

    def sort_by(self, key: str) -> None:
        self.sort_reverse = not self.sort_reverse if key == self.sort_col else False
        self.sort_col = key
        self.apply_sort()

    def selected_url(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return row_key.value
