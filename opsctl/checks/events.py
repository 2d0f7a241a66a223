"""Progress of a check, as typed events.

A check reports what it is doing through one callback, ``progress(event)``. The CLI
draws the events on stderr (:mod:`opsctl.ui.progress`), a ``--tui`` panel, the console
and certify consume the very same objects. Events are frozen data; ``snapshot()`` gives
the partial panel state an event stands for (the keys of ``opsctl.ui.panels.diag``):

    {"title", "phase", "columns", "rows", "events", "verdict", "summary", "warnings"}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    """Something a check reports while it runs; a panel folds its snapshot in."""

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets (none for the base event)."""
        return {}


@dataclass(frozen=True, slots=True)
class Started(Event):
    """A check began (title names it, e.g. "diag usage")."""

    title: str
    detail: str = ""

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the title and the first phase."""
        return {"title": self.title, "phase": self.detail or "starting"}


@dataclass(frozen=True, slots=True)
class Phase(Event):
    """A phase started; ``done``/``total`` count phases or requests where known."""

    name: str
    done: int | None = None
    total: int | None = None

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the phase."""
        return {"phase": self.name}


@dataclass(frozen=True, slots=True)
class EngineStarting(Event):
    """An engine for ``label`` is starting, with its run directory."""

    model: str
    run_dir: str
    label: str = ""

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the phase and one log line."""
        return {
            "phase": "starting engine",
            "events": [f"starting engine {self.model} (run dir {self.run_dir})"],
        }


@dataclass(frozen=True, slots=True)
class EngineReady(Event):
    """An engine answers at ``url`` (started in ``seconds``, or reused)."""

    url: str
    seconds: float | None = None  # None: an engine reused from the session
    reused: bool = False

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: how the engine became ready."""
        how = "reused" if self.reused else f"healthy after {self.seconds or 0:.1f} s"
        return {"events": [f"engine {how} at {self.url}"]}


@dataclass(frozen=True, slots=True)
class EngineStopped(Event):
    """An engine stopped; ``leftover_pids`` are processes that outlived it."""

    url: str
    seconds: float
    leftover_pids: tuple[int, ...] = ()

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: the stop and what was left."""
        left = f", LEFT {list(self.leftover_pids)}" if self.leftover_pids else ""
        return {"events": [f"engine at {self.url} stopped in {self.seconds:.1f} s{left}"]}


@dataclass(frozen=True, slots=True)
class Log(Event):
    """One line for the event log (``level`` info or warning)."""

    text: str
    level: str = "info"

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line (a warning prefixed so)."""
        prefix = "warning: " if self.level == "warning" else ""
        return {"events": [prefix + self.text]}


@dataclass(frozen=True, slots=True)
class Alert(Event):
    """A warning that stays on top of the report (e.g. test knobs active)."""

    text: str

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the warning, and a log line of it."""
        return {"warnings": [self.text], "events": [f"warning: {self.text}"]}


@dataclass(frozen=True, slots=True)
class Table(Event):
    """The check's live results table (replaces the previous one)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the table's columns and rows."""
        return {"columns": list(self.columns), "rows": [list(r) for r in self.rows]}


@dataclass(frozen=True, slots=True)
class CaseResult(Event):
    """One case passed or failed (``verdict`` pass | fail | unverified | skip)."""

    name: str
    verdict: str
    detail: str = ""

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: the case's verdict and detail."""
        tail = f": {self.detail}" if self.detail else ""
        return {"events": [f"{self.name} -> {self.verdict}{tail}"]}


@dataclass(frozen=True, slots=True)
class Counter(Event):
    """A named measurement (for listeners; the panel shows nothing of it)."""

    name: str
    value: float


@dataclass(frozen=True, slots=True)
class Finished(Event):
    """The check is done: its verdict, a summary and the final table rows."""

    verdict: str
    summary: str = ""
    rows: tuple[tuple[str, ...], ...] | None = None

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: phase done, the verdict, the summary and rows."""
        snap: dict[str, Any] = {"phase": "done", "verdict": self.verdict}
        if self.summary:
            snap["summary"] = self.summary
        if self.rows is not None:
            snap["rows"] = [list(r) for r in self.rows]
        return snap


@dataclass(frozen=True, slots=True)
class Update(Event):
    """Several panel fields at once (a phase change with its new table rows, say)."""

    fields: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the given fields, as they are."""
        return dict(self.fields)


@dataclass(frozen=True, slots=True)
class Prefixed(Event):
    """An event of one named part of a larger run, its lines prefixed ``[name]``.

    A part is a check of certify or a target of a fleet. The switches:

    - ``phase``: also the inner phase, as ``name: phase`` (not an inner Finished's "done":
      the part ending is not the run ending);
    - ``lines_of``: log lines only of inner events of these types (empty: of every event);
    - ``tag_warnings``: warnings prefixed ``[name]`` too (else as they are).
    """

    name: str
    event: Event
    phase: bool = False
    lines_of: tuple[type[Event], ...] = ()
    tag_warnings: bool = False

    def snapshot(self) -> dict[str, Any]:
        """The inner event's panel fields, prefixed and filtered by the switches."""
        inner = self.event.snapshot()
        out: dict[str, Any] = {}
        if inner.get("events") and (not self.lines_of or isinstance(self.event, self.lines_of)):
            out["events"] = [f"[{self.name}] {line}" for line in inner["events"]]
        if self.phase and inner.get("phase") and not isinstance(self.event, Finished):
            out["phase"] = f"{self.name}: {inner['phase']}"
        if inner.get("warnings"):
            tag = f"[{self.name}] " if self.tag_warnings else ""
            out["warnings"] = [tag + w for w in inner["warnings"]]
        return out


Progress = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The default progress callback of a library call: nobody is watching."""
