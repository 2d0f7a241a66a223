"""Run directories: which state each run is in, and what ``opsctl runs clean`` may do.

Pure logic (no I/O). The collector (opsctl.collectors.runs) reads ``<run>/meta.json``
(written by opsctl.engine.server) and the current start time of every process it
names; this module decides.

A process is *ours* only when its pid exists now **and** its start time equals the one
recorded for it (within :data:`START_TOLERANCE`): a pid the kernel gave to another
process later is never taken for an engine process, never signalled.

States:

- ``stopped``: ``stopped_at`` is set (opsctl stopped the engine);
- ``live``: the owner (the opsctl process that started it) is alive and some engine
  process is alive;
- ``orphaned``: the owner is gone (or its pid now belongs to someone else) but some
  engine process is alive: ``runs clean`` reaps it;
- ``dead``: no stop recorded and no engine process alive (crash, kill, reaped);
- ``unknown``: meta.json missing, unreadable or malformed, or an engine is alive but no
  owner is recorded (older opsctl): shown with the reason, never touched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opsctl.errors import BadInput

# psutil derives a start time from the boot time (whole seconds, re-read by every
# process; it can move by a second when the wall clock is stepped) plus clock ticks.
# A reused pid starts after the original exited, so a second and a half apart cannot
# be the same process in practice, and stepping never makes us lose our own.
START_TOLERANCE = 1.5
# Without recorded start times (meta.json of an older opsctl) the API server's start
# must fall within this window after ``started_at`` (Popen right after it is taken).
LEGACY_WINDOW = (-2.0, 10.0)

STATES = ("live", "orphaned", "stopped", "dead", "unknown")
SHM_PREFIXES = ("psm_", "sem.mp-")  # vLLM's shm_broadcast ring buffers, mp semaphores

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'30s', '10m', '2h', '1d', '1.5h' or plain seconds ('90') -> seconds.

    Raises ValueError with a one-line message for anything else (negative, empty, nan).
    """
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 30s, 10m, 2h, 1d, or seconds)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "s").lower()]
    if not math.isfinite(value):
        raise ValueError(f"not a duration: {text!r} (too large)")
    return value


def human_duration(seconds: float | None) -> str:
    """A duration for a table cell: ``1.5d``, ``2.0h``, ``3.2m`` or ``42s`` (``-``: unknown)."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.0f}s"


class MetaError(ValueError):
    """meta.json is not the document opsctl writes."""


@dataclass(frozen=True, slots=True)
class RunMeta:
    """What a run recorded about its server: URL, model, pids and their start times, times."""

    url: str | None
    model: str | None
    model_path: str | None
    api_pid: int | None
    started_at: float | None
    healthy_at: float | None
    owner_pid: int | None
    owner_started: float | None
    pids: tuple[tuple[int, float | None], ...]  # engine pid -> recorded start (None: legacy)
    stopped_at: float | None
    reaped_at: float | None  # set by `runs clean` after it reaped the orphan
    tmp_dir: str | None = None  # the engine's private $TMPDIR (removed with the run)

    @property
    def legacy(self) -> bool:
        """Written by an opsctl that recorded no owner and no start times."""
        return self.owner_pid is None


def _num(doc: dict, key: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise MetaError(f"meta.json: {key} is not a number: {v!r}")
    return float(v)


def _pid(doc: dict, key: str) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise MetaError(f"meta.json: {key} is not a pid: {v!r}")
    return v


def parse_meta(doc: Any) -> RunMeta:
    """A RunMeta from a decoded meta.json; MetaError (one line) when it is malformed."""
    if not isinstance(doc, dict):
        raise MetaError(f"meta.json is not a JSON object but {type(doc).__name__}")
    api_pid = _pid(doc, "pid")
    raw = doc.get("pids")
    pids: list[tuple[int, float | None]] = []
    if raw is not None:
        if not isinstance(raw, dict):
            raise MetaError("meta.json: pids is not an object of pid -> start time")
        for k, v in raw.items():
            if not str(k).isdigit() or int(k) <= 0:
                raise MetaError(f"meta.json: pids has a key that is not a pid: {k!r}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise MetaError(f"meta.json: pids[{k}] is not a start time: {v!r}")
            pids.append((int(k), float(v)))
    elif api_pid is not None:
        pids.append((api_pid, None))
    for key in ("url", "model", "model_path", "tmp_dir"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise MetaError(f"meta.json: {key} is not a string: {doc[key]!r}")
    return RunMeta(
        url=doc.get("url"),
        model=doc.get("model"),
        model_path=doc.get("model_path"),
        api_pid=api_pid,
        started_at=_num(doc, "started_at"),
        healthy_at=_num(doc, "healthy_at"),
        owner_pid=_pid(doc, "owner_pid"),
        owner_started=_num(doc, "owner_started"),
        pids=tuple(sorted(pids)),
        stopped_at=_num(doc, "stopped_at"),
        reaped_at=_num(doc, "reaped_at"),
        tmp_dir=doc.get("tmp_dir"),
    )


def same_process(recorded: float | None, now: float | None, tol: float = START_TOLERANCE) -> bool:
    """Whether the process now at a pid is the one recorded there (start times agree).

    Whether a process that started at ``now`` (None: no such process) is the one
    recorded as starting at ``recorded``.
    """
    return recorded is not None and now is not None and abs(now - recorded) <= tol


def pids_to_look_up(meta: RunMeta) -> list[int]:
    """Every pid whose current start time the collector must read."""
    out = {pid for pid, _ in meta.pids}
    if meta.owner_pid:
        out.add(meta.owner_pid)
    return sorted(out)


def alive_engine_pids(meta: RunMeta, starts: Mapping[int, float | None]) -> tuple[int, ...]:
    """Engine pids alive now *as the same process* that was recorded."""
    out = []
    for pid, recorded in meta.pids:
        now = starts.get(pid)
        if recorded is None:  # legacy meta: the API server must have started with the run
            if meta.started_at is not None and now is not None:
                lo, hi = LEGACY_WINDOW
                if lo <= now - meta.started_at <= hi:
                    out.append(pid)
        elif same_process(recorded, now):
            out.append(pid)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RunAssessment:
    """One run's state and why, its owner's liveness, and its pids alive or reused."""

    state: str  # one of STATES
    reason: str
    owner_alive: bool | None  # None: no owner recorded (or no meta)
    alive_pids: tuple[int, ...]  # engine pids alive with their recorded start time
    reused_pids: tuple[int, ...]  # recorded pids that now belong to other processes


def assess(
    meta: RunMeta | None, error: str | None, starts: Mapping[int, float | None]
) -> RunAssessment:
    """The state of one run from its meta and the start times of the processes now running.

    ``starts``: pid -> start time of the process now under each pid the run names (None or
    absent: no such process).
    """
    if meta is None:
        return RunAssessment("unknown", error or "no meta.json", None, (), ())
    alive = alive_engine_pids(meta, starts)
    reused = tuple(pid for pid, _ in meta.pids if pid not in alive and starts.get(pid) is not None)
    owner_alive: bool | None = None
    if meta.owner_pid is not None:
        owner_alive = same_process(meta.owner_started, starts.get(meta.owner_pid))
    n = len(alive)
    if meta.stopped_at is not None:
        extra = f"; {n} engine process(es) still alive" if n else ""
        return RunAssessment("stopped", f"stopped by opsctl{extra}", owner_alive, alive, reused)
    if alive:
        if owner_alive:
            why = f"opsctl pid {meta.owner_pid} runs it; {n} engine process(es)"
            return RunAssessment("live", why, True, alive, reused)
        if owner_alive is None:
            why = "engine alive but meta.json names no owner (older opsctl): live or orphaned?"
            return RunAssessment("unknown", why, None, alive, reused)
        gone = "now another process" if starts.get(meta.owner_pid or 0) is not None else "gone"
        why = f"its opsctl (pid {meta.owner_pid}) is {gone}; {n} engine process(es) alive"
        return RunAssessment("orphaned", why, False, alive, reused)
    if meta.reaped_at is not None:
        why = "orphan reaped by `opsctl runs clean`"
    elif owner_alive:
        why = f"no engine process alive; its opsctl (pid {meta.owner_pid}) still runs"
    else:
        why = "no engine process alive and no stop recorded (crashed or killed)"
    return RunAssessment("dead", why, owner_alive, (), reused)


def ended_at(meta: RunMeta | None, last_write: float | None) -> float | None:
    """When the run ended: its recorded stop or reap, else the last write into it."""
    if meta is not None:
        for t in (meta.stopped_at, meta.reaped_at):
            if t is not None:
                return t
    return last_write


@dataclass(frozen=True, slots=True)
class CleanDecision:
    """What ``runs clean`` does with one run (reap, prune or keep), and why."""

    action: str  # reap | prune | keep
    reason: str


def clean_decision(
    a: RunAssessment, ended: float | None, now: float, older_than: float
) -> CleanDecision:
    """What ``runs clean`` does with one run: reap an orphan, prune an old dead run, or keep.

    A reaped orphan's directory stays, for its log, until a later clean finds it old
    enough. A run is pruned when it stopped or died, its owner is gone, nothing of it is
    alive and it ended at least ``older_than`` seconds ago; the reason says why one is kept.
    """
    if a.state == "orphaned":
        return CleanDecision("reap", f"orphaned engine: {len(a.alive_pids)} process(es) to stop")
    if a.state in ("live", "unknown"):
        return CleanDecision("keep", f"{a.state}: {a.reason}")
    if a.alive_pids:
        return CleanDecision("keep", f"{len(a.alive_pids)} engine process(es) still alive")
    if a.owner_alive:
        return CleanDecision("keep", "its opsctl still runs (it may still use the directory)")
    age = None if ended is None else now - ended
    if age is not None and age < older_than:
        return CleanDecision(
            "keep",
            f"ended {human_duration(age)} ago, younger than --older-than "
            f"{human_duration(older_than)}",
        )
    return CleanDecision("prune", f"{a.state}, ended {human_duration(age)} ago")


def is_vllm_segment(name: str) -> bool:
    """Whether a /dev/shm name is one vLLM leaks when killed (``psm_*``, ``sem.mp-*``).

    ``psm_*`` are shm_broadcast ring buffers, ``sem.mp-*`` multiprocessing semaphores.
    Engram tables have their own clean.
    """
    return name.startswith(SHM_PREFIXES)


# ---- runs clean: options, the shm refusal rule, failure and hint lines ---------------------


def check_clean_options(yes: bool, with_shm: bool, force: bool) -> None:
    """Refuse (BadInput) ``--force`` without ``--shm --yes``."""
    if force and not (yes and with_shm):
        raise BadInput("--force only makes sense with --shm --yes")


def shm_refusal(denied: tuple[int, ...], force: bool) -> str | None:
    """The refusal line when leaked segments may not be removed, or None.

    When the maps or fds of some process could not be read, a segment only it holds
    would look free, so none is removed unless ``force``.
    """
    if not denied or force:
        return None
    return (
        f"kept every segment: the maps or fds of {len(denied)} process(es) could not be "
        "read, so a segment only they hold would look free; run as root / inside the vLLM "
        "container, or pass --force"
    )


def clean_failure(
    failed: list[tuple[str, str]], shm_kept: list[str], shm_refused: str | None
) -> str | None:
    """Why ``runs clean --yes`` failed (exit 1), or None when it did all it listed.

    A run it could not reap or prune ((name, error) pairs), else a refused or kept
    segment.
    """
    if failed:
        name, error = failed[0]
        return f"{name}: {error}"
    if shm_kept:
        return shm_refused or f"{len(shm_kept)} segment(s) kept (held again or not removable)"
    return None


def pending_hint(yes: bool, todo: int) -> str | None:
    """What a dry run that found work tells the operator to do next."""
    if yes or not todo:
        return None
    return f"{todo} item(s) listed; run again with --yes to act"
