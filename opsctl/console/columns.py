"""The console's fleet-table columns, declared once: the TUI's table and ``--once``'s.

Each :class:`FleetColumn` is a key, a header and how its cell is made from an
``EndpointView`` and the row's :class:`Row` (the moment, the poll interval, the row's
check note, the surface it is drawn on, the host's GPUs). The TUI's fleet table
(``opsctl.console.view_panel.COLUMNS``/``row_cells``, ``opsctl.console.view_fleet_table``)
shows every column of :data:`FLEET_TABLE` in its order; ``--once``'s table
(``opsctl.console.report.render_plain``) shows those :data:`ONCE_KEYS` names, in that
order. Both add :data:`GPU` last on a host with a GPU. A new column is one entry here
(and its key in ONCE_KEYS if ``--once`` shows it); a cell is text, no Rich markup.

Two surfaces draw the same column a little differently (:class:`Surface`): the TUI's
reason is cut at 80 characters, ``--once``'s at 200 (a plain line has room), and the
TUI's run cell adds the requests in flight through ``--tee`` (``3 · tee 1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opsctl.console import judge_requests as rq
from opsctl.console.judge import EndpointView
from opsctl.console.render_advice import alerts_cell, gpu_row_cell, reason_cell
from opsctl.domain.gpu import HostGpus


@dataclass(frozen=True, slots=True)
class Surface:
    """Where a row is drawn, and what that changes in its cells."""

    reason_width: int  # the reason's cut (before the alert prefix and the finding marker)
    tee: bool  # the run cell adds the requests in flight through --tee


TUI = Surface(reason_width=80, tee=True)
ONCE = Surface(reason_width=200, tee=False)


@dataclass(frozen=True, slots=True)
class Row:
    """What a row's cells are made from besides its view."""

    now: float  # the snapshot's time (the age column)
    interval: float  # the poll interval (a row is stale after 1.5 of them)
    note: str = ""  # the check column's text (a check's result, a bundle offer)
    surface: Surface = TUI
    host: HostGpus | None = None  # the host's GPUs (the GPU column)


@dataclass(frozen=True, slots=True)
class FleetColumn:
    """One column of the fleet table: its key (sorting, styles), header and cell."""

    key: str
    header: str
    cell: Callable[[EndpointView, Row], str]


def fmt(v: float | None, spec: str = ".1f", scale: float = 1.0, suffix: str = "") -> str:
    """``v`` scaled and formatted with ``spec`` plus ``suffix``; "-" when it is missing."""
    return "-" if v is None else f"{v * scale:{spec}}{suffix}"


def age_text(v: EndpointView, now: float, interval: float) -> str:
    """Empty while fresh; the data's age once it is older than 1.5 intervals."""
    age = v.age(now)
    if age is None:
        return "-" if v.scrapes else "…"
    return f"{age:.0f}s stale" if age > 1.5 * interval + 0.5 else ""


def tee_cell(v: rq.RequestsView | None) -> str:
    """What the fleet row's running cell adds: the requests in flight through the tee.

    '' without a tee.
    """
    return "" if v is None else f" · tee {len(v.in_flight)}"


def _model(v: EndpointView, row: Row) -> str:
    return v.info.models[0].id if v.info.models else "-"


def _running(v: EndpointView, row: Row) -> str:
    tee = tee_cell(v.requests) if row.surface.tee else ""  # + in flight through --tee
    return fmt(v.figures.running, ".0f") + tee


def _ttft50(v: EndpointView, row: Row) -> str:
    q = v.figures.latency.get("ttft")
    return fmt(q.p50 if q else None, ".0f", 1000, " ms")


def _ttft95(v: EndpointView, row: Row) -> str:
    q = v.figures.latency.get("ttft")
    return fmt(q.p95 if q else None, ".0f", 1000, " ms")


def _reason(v: EndpointView, row: Row) -> str:
    # Prometheus's alert, the reason, the top finding
    return alerts_cell(v.alerts) + reason_cell(v, row.surface.reason_width)


FLEET_TABLE: tuple[FleetColumn, ...] = (
    FleetColumn("name", "name", lambda v, r: v.target.name),
    FleetColumn("state", "state", lambda v, r: v.state),
    FleetColumn("model", "model", _model),
    FleetColumn("source", "source", lambda v, r: v.target.source),
    FleetColumn("running", "run", _running),
    FleetColumn("waiting", "wait", lambda v, r: fmt(v.figures.waiting, ".0f")),
    FleetColumn("kv", "KV %", lambda v, r: fmt(v.figures.kv_usage, ".1f", 100)),
    FleetColumn("gen", "gen tok/s", lambda v, r: fmt(v.figures.generation_tps)),
    FleetColumn("prompt", "prompt tok/s", lambda v, r: fmt(v.figures.prompt_tps)),
    FleetColumn("ttft50", "TTFT p50", _ttft50),
    FleetColumn("ttft95", "TTFT p95", _ttft95),
    FleetColumn("hit", "prefix hit", lambda v, r: fmt(v.figures.prefix_hit_rate, ".0f", 100, " %")),
    FleetColumn("restarts", "restarts", lambda v, r: str(v.restarts)),
    FleetColumn("age", "age", lambda v, r: age_text(v, r.now, r.interval)),
    FleetColumn("check", "check", lambda v, r: r.note[:60]),
    FleetColumn("url", "url", lambda v, r: v.target.url),
    FleetColumn("reason", "reason", _reason),
)  # fmt: skip
# ``--once``'s table: these columns of FLEET_TABLE, in this order (a piped line's
# first fields: name, url, source, state)
ONCE_KEYS = ("name", "url", "source", "state", "model", "running", "waiting", "kv", "gen",
             "ttft50", "reason")  # fmt: skip
# the last column of both tables on a host with a GPU (``has_gpus``)
GPU = FleetColumn("gpu", "GPU", lambda v, r: gpu_row_cell(v, r.host))

_BY_KEY = {c.key: c for c in FLEET_TABLE}


def has_gpus(host: HostGpus | None) -> bool:
    """Whether the GPU column is shown: the host was seen to have a GPU."""
    return host is not None and bool(host.devices)


def once_columns(host: HostGpus | None) -> tuple[FleetColumn, ...]:
    """``--once``'s columns: ONCE_KEYS's, then GPU on a host with a GPU."""
    return (*(_BY_KEY[k] for k in ONCE_KEYS), *((GPU,) if has_gpus(host) else ()))


def cells(columns: Sequence[FleetColumn], v: EndpointView, row: Row) -> tuple[str, ...]:
    """One endpoint's cells in ``columns``."""
    return tuple(c.cell(v, row) for c in columns)
