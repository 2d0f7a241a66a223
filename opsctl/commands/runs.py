"""`opsctl runs list | clean`: the run directories opsctl's engines leave, orphaned
engines, and leaked vLLM /dev/shm segments.

Typer only: the collector (opsctl.collectors.runs) reads and acts, the domain
(opsctl.domain.runs) decides; this module parses options, emits, maps errors.
"""

from __future__ import annotations

import typer

LIST_COLUMNS = ["run", "state", "model", "url", "started", "pids", "disk", "why"]


def _duration(text: str, flag: str) -> float:
    from opsctl.domain.runs import parse_duration
    from opsctl.errors import BadInput

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise BadInput(f"{flag}: {exc}") from None


def run_to_dict(snap) -> dict:
    from opsctl.domain import runs as dom

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
        "ended_at": dom.ended_at(m, snap.last_write) if a.state in ("stopped", "dead") else None,
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


def _stamp(t: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def render_list(console, doc: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from opsctl.output import human_bytes

    colours = {"live": "green", "orphaned": "red", "dead": "yellow", "unknown": "magenta"}
    t = Table(*LIST_COLUMNS, title=f"runs in {doc['runs_dir']}")
    for r in doc["runs"]:
        colour = colours.get(r["state"], "white")
        t.add_row(
            escape(r["name"]),
            f"[{colour}]{r['state']}[/]",
            escape(r["model"] or "-"),
            escape(r["url"] or "-"),
            _stamp(r["started_at"]),
            f"{len(r['alive_pids'])}/{len(r['pids'])}",
            human_bytes(r["disk_bytes"]),
            escape(r["reason"]),
        )
    console.print(t)
    counts = {s: sum(r["state"] == s for r in doc["runs"]) for s in doc["counts"]}
    console.print(
        ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no run directories",
        highlight=False,
    )


def list_document() -> dict:
    from opsctl import paths
    from opsctl.collectors import runs as col
    from opsctl.domain.runs import STATES
    from opsctl.output import document

    rows = [run_to_dict(s) for s in col.list_runs()]
    return document(
        "runs.list",
        runs_dir=str(paths.runs_dir()),
        runs=rows,
        counts={s: sum(r["state"] == s for r in rows) for s in STATES},
    )


def clean_document(
    older_than: float, yes: bool, with_shm: bool, min_age: float, force: bool, grace: float
) -> dict:
    import time
    from pathlib import Path

    from opsctl import paths
    from opsctl.collectors import runs as col
    from opsctl.collectors import shm
    from opsctl.domain import runs as dom
    from opsctl.output import document

    root = paths.runs_dir()
    now = time.time()
    rows = []
    for snap in col.list_runs(root):
        a = snap.assessment()
        d = dom.clean_decision(a, dom.ended_at(snap.meta, snap.last_write), now, older_than)
        rows.append(
            {
                "name": snap.name,
                "path": snap.path,
                "state": a.state,
                "action": d.action,
                "reason": d.reason,
                "alive_pids": list(a.alive_pids),
                "disk_bytes": snap.disk_bytes,
                "result": "dry run" if not yes else None,
            }
        )
    reaped, pruned, failed = [], [], []
    if yes:
        for r in rows:
            if r["action"] == "reap":
                rep = col.reap(Path(r["path"]), grace=grace)
                reaped.append(rep.to_dict())
                r["result"] = rep.error or "reaped"
                if rep.error:
                    failed.append({"name": r["name"], "error": rep.error})
            elif r["action"] == "prune":
                err = col.prune(Path(r["path"]), root, time.time(), older_than)
                r["result"] = err or "pruned"
                if err:
                    failed.append({"name": r["name"], "error": err})
                else:
                    pruned.append(r["name"])
            else:
                r["result"] = "kept"
    segs = None
    if with_shm:
        scan = col.vllm_segments(min_age)
        free = [s for s in scan.segments if s.status == "orphan"]
        removed: list[str] = []
        kept: list[str] = []
        refused = None
        if yes and free:
            if scan.denied_pids and not force:
                kept = [s.name for s in free]
                refused = (
                    f"kept every segment: the maps or fds of {len(scan.denied_pids)} "
                    "process(es) could not be read, so a segment only they hold would look "
                    "free; run as root / inside the vLLM container, or pass --force"
                )
            else:
                # rescans right before: held again or too young now -> kept; gone -> neither
                removed, kept = shm.remove_unheld([s.name for s in free], min_age=min_age)
        segs = {
            "root": str(shm.SHM),
            "min_age": min_age,
            "segments": [
                {
                    "name": s.name,
                    "size": s.size,
                    "pinned_bytes": s.allocated,
                    "age": s.age,
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
    return document(
        "runs.clean",
        runs_dir=str(root),
        dry_run=not yes,
        older_than=older_than,
        runs=rows,
        reaped=reaped,
        pruned=pruned,
        failed=failed,
        shm=segs,
    )


def render_clean(console, doc: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from opsctl.output import human_bytes

    t = Table("run", "state", "action", "result", "disk", "why", title="runs clean")
    for r in doc["runs"]:
        t.add_row(
            escape(r["name"]),
            r["state"],
            r["action"],
            escape(r["result"] or "-"),
            human_bytes(r["disk_bytes"]),
            escape(r["reason"]),
        )
    if doc["runs"]:
        console.print(t)
    else:
        console.print(f"no run directories in {doc['runs_dir']}", highlight=False)
    for rep in doc["reaped"]:
        console.print(
            f"reaped {rep['run']}: pids {rep['pids']} ({', '.join(rep['signals']) or 'gone'}), "
            f"{rep['seconds']} s; shm removed {rep['shm_removed'] or '-'}"
            + (f"; LEFT: {rep['leftover']}" if rep["leftover"] else ""),
            highlight=False,
        )
    s = doc["shm"]
    if s is None:
        return
    st = Table(
        "segment", "size", "pins", "age", "status", "holders", title=f"vLLM segments in {s['root']}"
    )
    removed = set(s["removed"])
    for g in s["segments"]:
        status = g["status"]
        if g["name"] in removed:
            status = "removed"
        elif status == "orphan":
            status = "kept" if not doc["dry_run"] else "would remove (--yes)"
        st.add_row(
            escape(g["name"]),
            human_bytes(g["size"]),
            human_bytes(g["pinned_bytes"]),
            f"{g['age']:.0f} s",
            status,
            ", ".join(f"{h['pid']}:{h['how']}" for h in g["holders"]) or "-",
        )
    console.print(st)
    console.print(
        f"{len(s['free'])} segment(s) no process maps or holds open, older than "
        f"{s['min_age']:g} s: {s['free_bytes']} bytes ({human_bytes(s['free_bytes'])}), "
        f"pinning {s['pinned_bytes']} bytes ({human_bytes(s['pinned_bytes'])}) of memory",
        highlight=False,
    )
    if s["refused"]:
        console.print(f"[yellow]refused:[/] {escape(s['refused'])}", highlight=False)


def register(app: typer.Typer) -> None:
    runs_app = typer.Typer(
        help="Run directories of opsctl's engines: list, reap orphans, prune; leaked vLLM /dev/shm.",
        no_args_is_help=True,
    )
    app.add_typer(runs_app, name="runs")

    @runs_app.command("list")
    def list_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
        """Every run directory: model, url, started, state (live / stopped / orphaned /
        dead / unknown), engine pids, disk size."""
        from opsctl.output import emit

        doc = list_document()
        emit(doc, as_json=as_json, render=lambda console: render_list(console, doc))

    @runs_app.command("clean")
    def clean_cmd(
        older_than: str = typer.Option(
            "0s",
            "--older-than",
            help="prune only stopped/dead runs that ended at least this long ago "
            "(30s, 10m, 2h, 1d; default 0s: every finished run)",
        ),
        yes: bool = typer.Option(
            False, "--yes", help="really reap/prune/remove (default: dry run)"
        ),
        with_shm: bool = typer.Option(
            False,
            "--shm",
            help="also list vLLM /dev/shm segments (psm_*, sem.mp-*) no process maps or "
            "holds open and older than --min-age; --yes removes them",
        ),
        min_age: str = typer.Option(
            "60s", "--min-age", help="with --shm: never remove a segment younger than this"
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="with --shm --yes: remove even though some processes' maps/fds could not be read",
        ),
        grace: str = typer.Option(
            "15s", "--grace", help="reap: SIGTERM, then SIGKILL of what is left by this time"
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Reap orphaned engines (pid AND start time match meta.json), remove the /dev/shm
        segments they leave (only those no live process maps or holds open), and prune
        stopped/dead run directories whose opsctl is gone. Dry run without --yes.

        Exit 1 when --yes could not do something it listed (a process survived, a
        directory could not be removed, segments were refused)."""
        from opsctl import output
        from opsctl.errors import BadInput, CheckFailed
        from opsctl.output import emit

        older = _duration(older_than, "--older-than")
        age = _duration(min_age, "--min-age")
        grace_s = _duration(grace, "--grace")
        if force and not (yes and with_shm):
            raise BadInput("--force only makes sense with --shm --yes")
        doc = clean_document(older, yes, with_shm, age, force, grace_s)
        emit(doc, as_json=as_json, render=lambda console: render_clean(console, doc))
        shm_doc = doc["shm"] or {}
        if yes and (doc["failed"] or shm_doc.get("kept")):
            first = doc["failed"][0] if doc["failed"] else None
            raise CheckFailed(
                f"{first['name']}: {first['error']}"
                if first
                else shm_doc.get("refused")
                or f"{len(shm_doc['kept'])} segment(s) kept (held again or not removable)"
            )
        if not yes:
            todo = [r for r in doc["runs"] if r["action"] != "keep"] + list(shm_doc.get("free", []))
            if todo:
                output.info(f"{len(todo)} item(s) listed; run again with --yes to act")
