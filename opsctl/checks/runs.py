"""opsctl's run directories as library calls: ``list_runs`` and ``clean``.

Like the Engram checks these look at this node (the runs directory, /proc, /dev/shm),
not at a server, so they take no target and no engine session:

- ``list_runs(ListOptions) -> Report`` (schema ``runs.list/1``): every run directory
  with its state (live / stopped / orphaned / dead / unknown, :mod:`opsctl.domain.runs`),
  engine pids, disk size.
- ``clean(CleanOptions, progress) -> RunsReport`` (``runs.clean/1``): reap orphaned
  engines, prune finished runs older than ``older_than``, and with ``shm`` list (remove)
  leaked vLLM /dev/shm segments. A dry run unless ``yes``; verdict fail when ``yes``
  could not do something it listed (``failure`` says what).

Example::

    from opsctl.checks import runs
    report = runs.clean(runs.CleanOptions(older_than=3600, yes=True))
    print(report.verdict, report.to_dict()["pruned"])
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, PASS, Report
from opsctl.domain import runs as runs_dom
from opsctl.suite.engram.judge import DEFAULT_MIN_AGE


@dataclass(frozen=True)
class RunsReport(Report):
    """A runs report, with the lines the CLI says around it.

    ``failure``: the line a failed verdict is reported with; ``hint``: what a dry run that
    found work suggests next."""

    failure: str | None = None
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class ListOptions:
    """Where ``runs list`` looks for run directories."""

    runs_dir: Path | None = None  # default: opsctl.paths.runs_dir()


def list_runs(options: ListOptions = ListOptions()) -> Report:
    """Every run directory and its state (read once, nothing changed)."""
    from opsctl import paths
    from opsctl.collectors import runs as runs_col
    from opsctl.output import document

    root = options.runs_dir or paths.runs_dir()
    rows = [run_dict(s) for s in runs_col.list_runs(root)]
    return Report(
        PASS,
        document(
            "runs.list",
            runs_dir=str(root),
            runs=rows,
            counts={s: sum(r["state"] == s for r in rows) for s in runs_dom.STATES},
        ),
    )


def run_dict(snap: Any) -> dict[str, Any]:
    """One run (a ``collectors.runs.RunSnapshot``) as listed in ``runs.list``."""
    a = snap.assessment()
    m = snap.meta
    starts = dict(snap.starts)
    return {
        "name": snap.name,
        "path": snap.path,
        "state": a.state,
        "reason": a.reason,
        "model": m.model if m else None,
        "url": m.url if m else None,
        "started_at": m.started_at if m else None,
        "healthy_at": m.healthy_at if m else None,
        "stopped_at": m.stopped_at if m else None,
        "reaped_at": m.reaped_at if m else None,
        "ended_at": runs_dom.ended_at(m, snap.last_write)
        if a.state in ("stopped", "dead")
        else None,
        "owner_pid": m.owner_pid if m else None,
        "owner_alive": a.owner_alive,
        "api_pid": m.api_pid if m else None,
        "pids": [
            {
                "pid": pid,
                "started": rec,
                "alive": pid in a.alive_pids,
                "now_started": starts.get(pid),
            }
            for pid, rec in (m.pids if m else ())
        ],
        "alive_pids": list(a.alive_pids),
        "reused_pids": list(a.reused_pids),
        "disk_bytes": snap.disk_bytes,
        "meta_error": snap.error,
    }


# ---- clean -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CleanOptions:
    """What ``runs clean`` reaps, prunes and removes, and whether it really does."""

    older_than: float = 0.0  # prune only runs that ended at least this many seconds ago
    yes: bool = False  # really reap / prune / remove (default: dry run)
    shm: bool = False  # also list (remove) leaked vLLM /dev/shm segments
    min_age: float = DEFAULT_MIN_AGE  # never remove a younger segment
    force: bool = False  # with shm and yes: remove although some processes were unreadable
    grace: float = 15.0  # reap: SIGTERM, then SIGKILL of what is left by this time
    runs_dir: Path | None = None  # default: opsctl.paths.runs_dir()

    def __post_init__(self) -> None:
        runs_dom.check_clean_options(self.yes, self.shm, self.force)


def clean(options: CleanOptions = CleanOptions(), progress: ev.Progress = ev.ignore) -> RunsReport:
    """Reap orphans, prune finished runs, list/remove leaked segments (see module doc)."""
    from opsctl import paths
    from opsctl.output import document

    root = options.runs_dir or paths.runs_dir()
    progress(ev.Phase(f"reading {root}"))
    rows = _plan_runs(root, options)
    reaped, pruned, failed = _act(rows, root, options, progress) if options.yes else ([], [], [])
    segs = _segments(options, progress) if options.shm else None
    failure = (
        runs_dom.clean_failure(
            [(f["name"], f["error"]) for f in failed],
            (segs or {}).get("kept", []),
            (segs or {}).get("refused"),
        )
        if options.yes
        else None
    )
    todo = [r for r in rows if r["action"] != "keep"] + list((segs or {}).get("free", []))
    verdict = FAIL if failure else PASS
    progress(ev.Finished(verdict, failure or f"{len(reaped)} reaped, {len(pruned)} pruned"))
    doc = document(
        "runs.clean/2",
        runs_dir=str(root),
        dry_run=not options.yes,
        older_than_s=options.older_than,
        runs=rows,
        reaped=reaped,
        pruned=pruned,
        failed=failed,
        shm=segs,
    )
    return RunsReport(
        verdict, doc, failure=failure, hint=runs_dom.pending_hint(options.yes, len(todo))
    )


def _plan_runs(root: Path, options: CleanOptions) -> list[dict[str, Any]]:
    from opsctl.collectors import runs as runs_col

    now = time.time()
    rows = []
    for snap in runs_col.list_runs(root):
        a = snap.assessment()
        d = runs_dom.clean_decision(
            a, runs_dom.ended_at(snap.meta, snap.last_write), now, options.older_than
        )
        rows.append(
            {
                "name": snap.name,
                "path": snap.path,
                "state": a.state,
                "action": d.action,
                "reason": d.reason,
                "alive_pids": list(a.alive_pids),
                "disk_bytes": snap.disk_bytes,
                "result": "dry run" if not options.yes else None,
            }
        )
    return rows


def _act(
    rows: list[dict[str, Any]], root: Path, options: CleanOptions, progress: ev.Progress
) -> tuple[list[dict], list[str], list[dict]]:
    """Reap and prune what the plan says (each re-checked by the collector right before);
    sets every row's result. Returns (reap reports, pruned names, failures)."""
    from opsctl.collectors import runs as runs_col

    reaped: list[dict] = []
    pruned: list[str] = []
    failed: list[dict] = []
    for r in rows:
        if r["action"] == "reap":
            progress(ev.Phase(f"reaping {r['name']}"))
            rep = runs_col.reap(Path(r["path"]), grace=options.grace)
            reaped.append(rep.to_dict())
            error = rep.error
            r["result"] = error or "reaped"
        elif r["action"] == "prune":
            error = runs_col.prune(Path(r["path"]), root, time.time(), options.older_than)
            r["result"] = error or "pruned"
            if not error:
                pruned.append(r["name"])
        else:
            r["result"] = "kept"
            continue
        if error:
            failed.append({"name": r["name"], "error": error})
        progress(ev.Log(f"{r['name']}: {r['result']}", "warning" if error else "info"))
    return reaped, pruned, failed


def _segments(options: CleanOptions, progress: ev.Progress) -> dict[str, Any]:
    """Leaked vLLM /dev/shm segments; with ``yes`` the free ones are removed (the shm
    collector rescans right before: held again or young now -> kept; gone -> neither)."""
    from opsctl.collectors import runs as runs_col
    from opsctl.collectors import shm

    progress(ev.Phase(f"scanning {shm.SHM} for vLLM segments"))
    scan = runs_col.vllm_segments(options.min_age)
    free = [s for s in scan.segments if s.status == "orphan"]
    removed: list[str] = []
    kept: list[str] = []
    refused = None
    if options.yes and free:
        refused = runs_dom.shm_refusal(scan.denied_pids, options.force)
        if refused:
            kept = [s.name for s in free]
            progress(ev.Alert(refused))
        else:
            removed, kept = shm.remove_unheld([s.name for s in free], min_age=options.min_age)
    return {
        "root": str(shm.SHM),
        "min_age_s": options.min_age,
        "segments": [
            {
                "name": s.name,
                "size_bytes": s.size,
                "pinned_bytes": s.allocated,
                "age_s": s.age,
                "status": s.status,
                "holders": [{"pid": pid, "how": how} for pid, how in s.holders],
            }
            for s in scan.segments
        ],
        "free": [s.name for s in free],
        "free_bytes": sum(s.size for s in free),
        "pinned_bytes": sum(s.allocated for s in free),
        "removed": removed,
        "kept": sorted(set(kept)),
        "unchecked_pids": list(scan.denied_pids),
        "refused": refused,
    }
