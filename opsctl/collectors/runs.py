"""Run directories under ``paths.runs_dir()``: read, reap, prune, find leaked segments.

Each run is read once into a frozen snapshot; reap stops an orphaned engine, prune removes a
finished run.

Reading: every subdirectory becomes a :class:`RunSnapshot` (meta.json parsed by
:func:`opsctl.domain.runs.parse_meta`, the current start time of every pid it names,
the disk size). A missing, unreadable or malformed meta.json is a field with the
reason, never an exception; a process that exits mid-read is simply not alive.

Acting (each re-reads the run right before, and refuses unless the domain still says
so):

- :func:`reap`: an *orphaned* run's engine processes (only those whose pid and start
  time match meta.json, plus their current descendants) get SIGTERM (API server
  first, so vLLM shuts its engine down), then SIGTERM to all, then SIGKILL, within
  ``grace`` seconds; psutil refuses to signal a pid that was reused meanwhile. The
  /dev/shm segments those processes mapped or held open are then removed with the
  engine stop's rule (:func:`opsctl.collectors.shm.remove_unheld`). The result is
  recorded in meta.json (``reaped_at``, ``reap``).
- :func:`prune`: removes a *stopped* or *dead* run directory (a real directory right
  under the runs directory, containing meta.json), never a symlink's target.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from opsctl import paths
from opsctl.collectors import engine_tmp, shm
from opsctl.domain import runs as runs_dom
from opsctl.suite.engram.judge import segment_status


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """One run directory as read now: its meta.json, its pids' start times, its size."""

    name: str
    path: str
    meta: runs_dom.RunMeta | None
    error: str | None  # why meta is None
    starts: tuple[tuple[int, float | None], ...]  # pid -> start time now (None: not running)
    disk_bytes: int
    last_write: float | None  # newest mtime of meta.json / server.log / the directory
    taken_at: float

    def assessment(self) -> runs_dom.RunAssessment:
        """What the run is now (live, orphaned, finished...) by the domain's rule."""
        return runs_dom.assess(self.meta, self.error, dict(self.starts))


def process_start(pid: int) -> float | None:
    """The start time of the process with this pid now; None when there is none (or a zombie).

    A zombie has exited and holds nothing."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def dir_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def read_run(path: Path) -> RunSnapshot:
    """Read one run directory; a missing or malformed meta.json is the snapshot's error."""
    meta: runs_dom.RunMeta | None = None
    error: str | None = None
    meta_path = path / "meta.json"
    try:
        if meta_path.is_symlink() or not meta_path.is_file():
            raise runs_dom.MetaError(
                "no meta.json (not a run directory, or an engine start in progress)"
                if not meta_path.exists() and not meta_path.is_symlink()
                else "meta.json is not a regular file"
            )
        meta = runs_dom.parse_meta(json.loads(meta_path.read_text()))
    except runs_dom.MetaError as exc:
        error = str(exc)
    except ValueError as exc:
        error = f"meta.json is not valid JSON: {str(exc).splitlines()[0]}"
    except OSError as exc:
        error = f"cannot read meta.json: {exc.strerror or exc}"
    starts = (
        tuple((pid, process_start(pid)) for pid in runs_dom.pids_to_look_up(meta)) if meta else ()
    )
    writes = []
    for p in (path, meta_path, path / "server.log"):
        with contextlib.suppress(OSError):
            writes.append(p.lstat().st_mtime)
    return RunSnapshot(
        path.name,
        str(path),
        meta,
        error,
        starts,
        dir_size(path),
        max(writes) if writes else None,
        time.time(),
    )


def list_runs(root: Path | None = None) -> tuple[RunSnapshot, ...]:
    """One snapshot per directory under the runs directory, oldest name first.

    Names start with the start time. Symlinks and plain files there are not runs."""
    root = paths.runs_dir() if root is None else root
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return ()
    return tuple(read_run(Path(e.path)) for e in entries if e.is_dir(follow_symlinks=False))


# ---- reap --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReapReport:
    """What stopping a run's engine did: processes signalled, survivors, segments removed."""

    run: str
    pids: tuple[int, ...]  # processes signalled (verified by start time)
    signals: tuple[str, ...]
    leftover: tuple[int, ...]  # still alive after the grace period
    shm_removed: tuple[str, ...]
    shm_kept: tuple[str, ...]
    seconds: float
    error: str | None = None

    def to_dict(self) -> dict:
        """The report as a JSON object (``seconds`` named ``duration_s``)."""
        doc = asdict(self)
        doc["duration_s"] = doc.pop("seconds")  # JSON names carry their unit
        return doc


def _living(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:  # is_running() compares the start time: a reused pid is not ours
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)


def _wait_gone(procs: list[psutil.Process], deadline: float) -> None:
    while time.time() < deadline and _living(procs):
        time.sleep(0.1)


def _engine_processes(snap: RunSnapshot) -> list[psutil.Process]:
    """The run's engine processes whose start time matches meta.json, and their current
    descendants (started by a verified process of ours, so ours too)."""
    assert snap.meta is not None
    procs: dict[int, psutil.Process] = {}
    me = os.getpid()
    for pid in snap.assessment().alive_pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p = psutil.Process(pid)
            if pid == me or not runs_dom.same_process(
                dict(snap.meta.pids).get(pid), p.create_time()
            ):
                continue
            procs[pid] = p
            for c in p.children(recursive=True):
                if c.pid != me:
                    procs.setdefault(c.pid, c)
    return list(procs.values())


def _held_segments(pids: list[int]) -> set[str]:
    """Names of /dev/shm files (linked, directly in /dev/shm) these processes hold."""
    scan = shm.scan_holders(pids, path_prefix=f"{shm.SHM}/")
    held = [m.path for m in scan.mappings if not m.deleted] + [
        d.path for d in scan.fds if not d.deleted
    ]
    return {os.path.basename(p) for p in held if os.path.dirname(p) == str(shm.SHM)}


def _record(path: Path, **fields) -> None:
    meta_path = path / "meta.json"
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(meta_path.read_text())
        if isinstance(doc, dict):
            doc.update(fields)
            tmp = meta_path.with_name(".meta.json.tmp")
            tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
            os.replace(tmp, meta_path)


def stop_engine(snap: RunSnapshot, grace: float = 15.0) -> ReapReport:
    """Stop a run's engine by the rule of the module doc; what was signalled and removed.

    SIGTERM to its API server (vLLM shuts its engine down), then SIGTERM to all, then SIGKILL,
    within ``grace`` seconds; once nothing is left, the /dev/shm segments they held that no live
    process holds are removed."""
    t0 = time.time()
    procs = _engine_processes(snap)
    segments = _held_segments([p.pid for p in procs])
    signals: list[str] = []
    api = [p for p in procs if snap.meta and p.pid == snap.meta.api_pid]
    if api:
        _signal_all(api, signal.SIGTERM)
        signals.append("SIGTERM api-server")
        _wait_gone(procs, t0 + grace * 0.6)
    for sig, name, share in ((signal.SIGTERM, "SIGTERM all", 0.8), (signal.SIGKILL, "SIGKILL", 1)):
        if _living(procs):
            if sig == signal.SIGKILL:  # frozen, none makes a segment between look and kill
                _signal_all(_living(procs), signal.SIGSTOP)
                segments |= _held_segments([p.pid for p in _living(procs)])
            _signal_all(_living(procs), sig)
            signals.append(name)
            _wait_gone(procs, t0 + grace * share)
    leftover = tuple(sorted(p.pid for p in _living(procs)))
    # what the engine's own resource tracker did not unlink; the stop's rule: only
    # segments no live process maps or holds open
    removed, kept = shm.remove_unheld(segments) if not leftover else ([], [])
    return ReapReport(
        snap.name,
        tuple(sorted(p.pid for p in procs)),
        tuple(signals),
        leftover,
        tuple(removed),
        tuple(kept),
        round(time.time() - t0, 3),
        f"{len(leftover)} process(es) survived SIGKILL" if leftover else None,
    )


def reap(path: Path, grace: float = 15.0) -> ReapReport:
    """Stop an orphaned run's engine and remove the segments it leaves (see module doc).

    Refuses (``error`` set, nothing signalled) unless the run is still orphaned."""
    snap = read_run(path)
    a = snap.assessment()
    if a.state != "orphaned":
        return ReapReport(snap.name, (), (), (), (), (), 0.0, f"not orphaned now ({a.state})")
    report = stop_engine(snap, grace)
    if not report.leftover:
        if snap.meta is not None:  # and the engine's private $TMPDIR (its IPC sockets)
            engine_tmp.remove(snap.meta.tmp_dir, path)
        _record(path, reaped_at=time.time(), reap=report.to_dict())
    return report


def prune(path: Path, root: Path | None, now: float, older_than: float) -> str | None:
    """Remove one finished run directory; None when removed, else why not.

    Re-reads the run and asks the domain again right before."""
    root = paths.runs_dir() if root is None else root
    if path.is_symlink() or not path.is_dir() or path.parent.resolve() != root.resolve():
        return "not a run directory under the runs directory"
    snap = read_run(path)
    if snap.meta is None:
        return f"not removed: {snap.error}"
    a = snap.assessment()
    d = runs_dom.clean_decision(a, runs_dom.ended_at(snap.meta, snap.last_write), now, older_than)
    if d.action != "prune":
        return f"not removed: {d.reason}"
    engine_tmp.remove(snap.meta.tmp_dir, path)  # only ever one made for this run
    try:
        shutil.rmtree(path)
    except OSError as exc:
        return f"cannot remove: {exc}"
    return None


# ---- leaked vLLM segments ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """One vLLM /dev/shm segment: its size, age and what clean may do with it."""

    name: str
    path: str
    size: int
    allocated: int  # bytes of memory it pins
    age: float
    status: str  # orphan | young | in-use | symlink (opsctl.suite.engram.judge.segment_status)
    holders: tuple[tuple[int, str], ...]  # (pid, "mapped" / "open" / "mapped+open")


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """Every vLLM /dev/shm segment found in one look, and the processes that could not be read."""

    segments: tuple[Segment, ...]
    denied_pids: tuple[int, ...]  # maps or fds unreadable: a segment only they hold looks free
    taken_at: float


def vllm_segments(min_age: float, root: Path | None = None) -> SegmentScan:
    """/dev/shm files that look like vLLM's, with who holds them.

    Their names are ``psm_*`` and ``sem.mp-*``; each comes with what clean may do with it."""
    root = shm.SHM if root is None else root
    files = [f for f in shm.list_files(root) if runs_dom.is_vllm_segment(f.name)]
    scan = shm.scan_holders(None, path_prefix=f"{root}/")
    now = time.time()
    out = []
    for f in files:
        holders = scan.holders(f)
        status = segment_status(bool(holders), f.is_symlink, f.age(now), min_age)
        out.append(
            Segment(
                f.name,
                f.path,
                f.size,
                f.allocated,
                round(f.age(now), 3),
                status,
                tuple((pid, "+".join(sorted(how))) for pid, how in sorted(holders.items())),
            )
        )
    return SegmentScan(tuple(out), scan.denied_pids, now)


def find_run_dir(url: str, root: Path | None = None) -> Path | None:
    """The run directory of the live engine opsctl started at ``url``; None when there is none.

    Its meta.json names that URL, it has not stopped, and its recorded pid is still alive; the
    newest wins. None for an engine not started by opsctl, or a dead one."""
    best: tuple[float, Path] | None = None
    base = paths.runs_dir() if root is None else root
    for meta_path in base.glob("*/meta.json"):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        if str(meta.get("url", "")).rstrip("/") != url.rstrip("/") or meta.get("stopped_at"):
            continue
        pid = meta.get("pid")
        if not isinstance(pid, int) or not psutil.pid_exists(pid):
            continue
        try:
            started = float(meta.get("started_at") or 0)
        except (TypeError, ValueError):
            started = 0.0
        if best is None or started > best[0]:
            best = (started, meta_path.parent)
    return best[1] if best else None
