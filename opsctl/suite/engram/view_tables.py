"""Rich rendering of the ``engram inspect | plan | clean`` documents (stdout, no --json).

The documents are the reports of :mod:`opsctl.suite.engram.run_tables`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from opsctl.output import human_bytes, render_findings
from opsctl.suite.engram.run_tables import COLUMNS, table_row


def render_inspect(console: Console, doc: dict[str, Any]) -> None:
    """Print ``engram inspect``'s document: the tables found, /dev/shm, and the findings."""
    s = doc["shm"]
    console.print(
        f"[b]engram inspect[/] (this node): mappers on vLLM {doc.get('vllm_version') or '?'}, "
        f"platform {doc.get('platform') or _unknown(doc.get('platform_note'))}",
        highlight=False,
    )
    t = Table(*COLUMNS, title=f"Engram tables ({doc['prefix']}*)")
    for table in doc["tables"]:
        t.add_row(*table_row(table))
    console.print(t)
    console.print(
        f"/dev/shm: {human_bytes(s['total_bytes'])} total, {human_bytes(s['used_bytes'])} used, "
        f"{human_bytes(s['free_bytes'])} free"
    )
    render_findings(console, doc["findings"], doc["verdict"])


def _unknown(note: str | None) -> str:
    return f"unknown ({note})" if note else "?"


def render_plan(console: Console, doc: dict[str, Any]) -> None:
    """Print ``engram plan``'s document: the tables' sizes and each placement's cost."""
    sp = doc["spec"]
    console.print(
        f"[b]{doc['source']}[/b]: {len(sp['layer_ids'])} Engram layer(s) {sp['layer_ids']}, "
        f"{sp['total_rows']:,} rows x ({sp['head_dim']} fp8 + {sp['head_dim'] // sp['block']} ue8m0) "
        f"bytes, scale block {sp['block']} ({sp['block_source']}), "
        f"{sp['n_hash_cols']} hash heads per layer",
        highlight=False,
    )
    console.print(
        f"tables: [b]{human_bytes(doc['total_bytes'])}[/b] ({doc['total_bytes']:,} bytes) "
        f"= {', '.join(human_bytes(b) for b in doc['layer_bytes'])} per layer",
        highlight=False,
    )
    t = Table(
        "placement",
        "head shards",
        "per rank",
        "per rank (PSS)",
        "per node",
        "in /dev/shm",
        "vLLM 0.32",
        title=f"TP={doc['tp']} DP={doc['dp']} nodes={doc['nodes']} (engram DP group {doc['engram_dp']})",
    )
    for p in doc["placements"]:
        mark = "chosen" if p["name"] == doc["chosen"] else ("possible" if p["available"] else "-")
        t.add_row(
            p["name"],
            str(p["shards"]),
            human_bytes(p["per_rank_bytes"]),
            human_bytes(p["per_rank_pss_bytes"]),
            human_bytes(p["per_node_bytes"]),
            human_bytes(p["shm_bytes"]),
            mark,
        )
    console.print(t)
    fits = {True: "holds", False: "does NOT hold", None: "?"}[doc["fits_shm"]]
    console.print(
        f"{doc['shm_source']}: {human_bytes(doc['shm_free_bytes'])} free -> {fits} the "
        f"{human_bytes(doc['total_bytes'])} of tables",
        highlight=False,
    )
    console.print(f"decision: [b]{doc['chosen']}[/b]: {doc['reason']}", highlight=False)
    for note in doc["notes"]:
        console.print(f"note: {note}", highlight=False)


def _orphan_status(doc: dict[str, Any], name: str) -> str:
    if name in doc["removed"]:
        return "removed"
    if name in doc["kept"]:
        return (
            "kept (unreadable mappings)" if doc.get("refused") else "kept (now held, young or gone)"
        )
    return "would remove (--yes)"


def render_clean(console: Console, doc: dict[str, Any]) -> None:
    """Print ``engram clean``'s document: the orphans, the files left alone, and what was done."""
    t = Table("orphan", "size", "status", title=f"orphaned {doc['prefix']}* files in /dev/shm")
    for o in doc["orphans"]:
        t.add_row(o["name"], human_bytes(o["size_bytes"]), _orphan_status(doc, o["name"]))
    console.print(t)
    lines = []
    if doc["mapped"]:
        lines.append(f"in use (mapped, left alone): {', '.join(doc['mapped'])}")
    if doc.get("open"):
        lines.append(f"in use (open, not mapped, left alone): {', '.join(doc['open'])}")
    if doc.get("young"):
        lines.append(
            f"younger than --min-age {doc['min_age_s']:g} s (left alone): "
            f"{', '.join(o['name'] for o in doc['young'])}"
        )
    if doc["ignored_symlinks"]:
        lines.append(f"symlinks (never touched): {', '.join(doc['ignored_symlinks'])}")
    if doc.get("refused"):
        lines.append(f"[yellow]refused:[/] {doc['refused']}")
    if doc["orphans"]:
        lines.append(
            "note: only processes in this PID namespace are seen; run clean where vLLM runs"
        )
    for line in lines:
        console.print(line, highlight=False)
