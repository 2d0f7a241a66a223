"""Record a console session as JSONL and show it again (``--record``, ``--replay``).

For attaching a session to a bug report.

The file: a header line ``{"schema": "opsctl.console-record/1", ...}``, then one line
per frame: ``{"t": taken_at, "snapshot": <FleetSnapshot>, "notes": {url: text}}``
(``notes`` are the console's per-row check results, so a replay shows the same rows).
Each line is flushed as written, so a session that crashed still replays.

:class:`ReplaySource` is a FleetSource: the UI reads it like a live one. It plays the
frames at their recorded pace times ``speed``; ``set_paused``, ``step(n)`` (pauses),
``faster()``/``slower()`` drive it. ``series()`` is rebuilt from the frames' figures
(one point per frame, the last 10 minutes), so a replayed sparkline has the frames'
resolution, not the scrapes'."""

from __future__ import annotations

import json
import time
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from opsctl.console.judge import EndpointView, FleetSnapshot
from opsctl.console.source import SourceDefaults
from opsctl.errors import BadInput

SCHEMA = "opsctl.console-record/1"
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
HISTORY_S = 600.0


# ---- codec -------------------------------------------------------------------------------


def encode(snap: FleetSnapshot) -> dict[str, Any]:
    """A FleetSnapshot as a JSON-ready dict (one recorded frame)."""
    return asdict(snap)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _decode(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(args[0], value) if len(args) == 1 else value
    if is_dataclass(tp) and isinstance(tp, type):
        hints = _hints(tp)
        kw = {f.name: _decode(hints[f.name], value[f.name]) for f in fields(tp) if f.name in value}
        return tp(**kw)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x) for x in value)
        return tuple(_decode(a, x) for a, x in zip(args, value, strict=False))
    if origin is dict:
        args = typing.get_args(tp)
        return {k: _decode(args[1], v) for k, v in value.items()} if args else dict(value)
    if tp is float and isinstance(value, int | float):
        return float(value)
    return value


def decode(doc: dict[str, Any]) -> FleetSnapshot:
    """A FleetSnapshot from a recorded frame's dict."""
    return _decode(FleetSnapshot, doc)


# ---- recording ---------------------------------------------------------------------------


class Recorder:
    """Appends frames to ``path``; an unchanged frame within ``min_gap`` s is skipped.

    The file is truncated at start. A frame equal to the previous one is written again
    only ``min_gap`` seconds after it."""

    def __init__(self, path: Path, min_gap: float = 0.2) -> None:
        self.path = path
        self.min_gap = min_gap
        self.frames = 0
        self._last: tuple[float, tuple, dict] | None = None
        try:
            self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None

    def write(self, snap: FleetSnapshot, notes: dict[str, str] | None = None) -> None:
        """Write one frame (and the header before the first); skip an unchanged one."""
        notes = dict(notes or {})
        if self._fh.closed:
            return
        if self.frames == 0:
            head = {"schema": SCHEMA, "recorded_at": time.time(), "source": snap.source,
                    "interval_s": snap.interval_s}  # fmt: skip
            self._fh.write(json.dumps(head) + "\n")
        last = self._last
        same = last is not None and snap.endpoints == last[1] and notes == last[2]
        if same and last is not None and snap.taken_at - last[0] < self.min_gap:
            return
        line = {"t": snap.taken_at, "snapshot": encode(snap), "notes": notes}
        self._fh.write(json.dumps(line, default=str) + "\n")
        self._fh.flush()
        self._last = (snap.taken_at, snap.endpoints, notes)
        self.frames += 1

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


# ---- replay ------------------------------------------------------------------------------


def load(path: Path) -> tuple[dict[str, Any], list[tuple[FleetSnapshot, dict[str, str]]]]:
    """The header and the frames of a recording; BadInput (with the line) otherwise."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = [ln for ln in lines if ln.strip()]
    try:
        head = json.loads(lines[0]) if lines else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("schema") != SCHEMA:
        raise BadInput(f"{path} is not a console recording (opsctl console --record FILE)")
    frames = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            doc = json.loads(line)
            frames.append((decode(doc["snapshot"]), dict(doc.get("notes") or {})))
        except (ValueError, KeyError, TypeError) as exc:
            if n == len(lines):  # a session killed mid-write: its last line may be cut
                break
            raise BadInput(f"{path}:{n}: not a recorded frame ({exc})") from None
    if not frames:
        raise BadInput(f"{path} holds no frames")
    return head, frames


def _series_value(v: EndpointView, name: str) -> float:
    if name == "ttft_p50":
        q = v.figures.latency.get("ttft")
        return (q.p50 if q else None) or 0.0
    return getattr(v.figures, name, None) or 0.0


class ReplaySource(SourceDefaults):
    """Recorded frames as a FleetSource (see the module doc)."""

    name = "replay"
    live = False  # --once reads the last frame; waiting changes nothing

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.head, self.frames = load(path)
        self.clock = clock
        self.index = 0
        self.paused = False
        self.speed = 1.0
        self._anchor = (clock(), self.frames[0][0].taken_at)
        self.timeout = 0.0

    # ---- playback ------------------------------------------------------------------------
    def _advance(self) -> None:
        if self.paused:
            return
        wall, t0 = self._anchor
        due = t0 + (self.clock() - wall) * self.speed
        while self.index + 1 < len(self.frames) and self.frames[self.index + 1][0].taken_at <= due:
            self.index += 1

    def _reanchor(self) -> None:
        self._anchor = (self.clock(), self.frames[self.index][0].taken_at)

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the replay at the current frame."""
        self._advance()
        self.paused = paused
        self._reanchor()

    def step(self, n: int) -> None:
        """Pause and move ``n`` frames (negative: back)."""
        self._advance()
        self.paused = True
        self.index = max(0, min(len(self.frames) - 1, self.index + n))
        self._reanchor()

    def faster(self) -> None:
        """Play faster (the next speed step)."""
        self._set_speed(+1)

    def slower(self) -> None:
        """Play slower (the previous speed step)."""
        self._set_speed(-1)

    def _set_speed(self, direction: int) -> None:
        self._advance()
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else SPEEDS.index(1.0)
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + direction))]
        self._reanchor()

    @property
    def at_end(self) -> bool:
        """Whether the replay shows its last frame."""
        return self.index == len(self.frames) - 1

    def status_line(self) -> str:
        """The replay's status: file, frame, time into the session, speed, state."""
        self._advance()
        first = self.frames[0][0].taken_at
        now = self.frames[self.index][0].taken_at
        state = "end" if self.at_end else ("paused" if self.paused else "playing")
        return (
            f"REPLAY {self.path.name} frame {self.index + 1}/{len(self.frames)} "
            f"+{now - first:.0f}s x{self.speed:g} {state}"
        )

    # ---- FleetSource ---------------------------------------------------------------------
    def start(self) -> None:
        """Start playing from the current frame."""
        self._reanchor()

    def collect(self) -> FleetSnapshot:
        """The frame due now."""
        self._advance()
        return self.frames[self.index][0]

    def notes(self) -> dict[str, str]:
        """The per-row notes recorded with the frame due now."""
        self._advance()
        return dict(self.frames[self.index][1])

    def series(self, url: str, name: str) -> list[float]:
        """One figure of one endpoint over the recorded frames up to now (sparkline)."""
        now = self.frames[self.index][0].taken_at
        out = []
        for snap, _ in self.frames[: self.index + 1]:
            if now - snap.taken_at > HISTORY_S:
                continue
            v = next((v for v in snap.endpoints if v.target.url == url), None)
            if v is not None:
                out.append(_series_value(v, name))
        return out

    def refresh(self) -> None:
        """Nothing to poll: the frames are recorded."""
        return None

    def wait_settled(self, timeout: float) -> bool:
        """A replay is always settled (True)."""
        return True

    def close(self) -> None:
        """Nothing to stop."""
        return None


def open_replay(path: Path, *, others: bool, record: Path | None, once: bool) -> ReplaySource:
    """The command's --replay source; refuses a live fleet or --record beside it.

    With --once, the session's last frame."""
    if others:
        raise BadInput("--replay shows a recording: drop URL arguments, --targets, --prometheus")
    if record is not None:
        raise BadInput("--replay and --record do not go together")
    source = ReplaySource(path)
    if once:
        source.step(len(source.frames))
    return source
