"""Rich rendering of the ``runs list | clean`` documents (:mod:`opsctl.checks.runs`)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import human_bytes

LIST_COLUMNS = ("run", "state", "model", "url", "started", "alive/pids", "disk", "why")
STATE_COLOURS = {"live": "green", "orphaned": "red", "dead": "yellow", "unknown": "magenta"}


def _stamp(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def render_list(console: Console, doc: dict[str, Any]) -> None:
    """Print ``runs list``'s document: one row per run, state, model, URL, pids, disk."""
    t = Table(*LIST_COLUMNS, title=f"runs in {doc['runs_dir']}")
    for r in doc["runs"]:
        colour = STATE_COLOURS.get(r["state"], "white")
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
    if doc["runs"]:
        console.print(
            "alive/pids: processes of the run still alive / processes it started", highlight=False
        )


def render_clean(console: Console, doc: dict[str, Any]) -> None:
    """Print ``runs clean``'s document: per run the action and result, reaps, then segments."""
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
            f"{rep['duration_s']} s; shm removed {rep['shm_removed'] or '-'}"
            + (f"; LEFT: {rep['leftover']}" if rep["leftover"] else ""),
            highlight=False,
        )
    if doc["shm"] is not None:
        _render_segments(console, doc["shm"], doc["dry_run"])


def _render_segments(console: Console, s: dict[str, Any], dry_run: bool) -> None:
    st = Table(
        "segment", "size", "pins", "age", "status", "holders", title=f"vLLM segments in {s['root']}"
    )
    removed = set(s["removed"])
    for g in s["segments"]:
        status = g["status"]
        if g["name"] in removed:
            status = "removed"
        elif status == "orphan":
            status = "kept" if not dry_run else "would remove (--yes)"
        st.add_row(
            escape(g["name"]),
            human_bytes(g["size_bytes"]),
            human_bytes(g["pinned_bytes"]),
            f"{g['age_s']:.0f} s",
            status,
            ", ".join(f"{h['pid']}:{h['how']}" for h in g["holders"]) or "-",
        )
    console.print(st)
    console.print(
        f"{len(s['free'])} segment(s) no process maps or holds open, older than "
        f"{s['min_age_s']:g} s: {s['free_bytes']} bytes ({human_bytes(s['free_bytes'])}), "
        f"pinning {s['pinned_bytes']} bytes ({human_bytes(s['pinned_bytes'])}) of memory",
        highlight=False,
    )
    if s["refused"]:
        console.print(f"[yellow]refused:[/] {escape(s['refused'])}", highlight=False)
