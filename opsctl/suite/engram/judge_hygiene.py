"""engram's certify check, pure: inspect's and clean's documents into the server's findings.

The tables and findings of ``engram inspect`` (:mod:`opsctl.suite.engram.run_tables`) narrowed
to the server under check, plus clean's orphans and the plan's /dev/shm capacity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding


def server_tables(
    tables: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    pids: Sequence[int],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], list[str]]:
    """engram inspect's tables and findings narrowed to the server under check.

    ``pids``: the server's processes on this node (its API server and every descendant);
    empty when none is local, and then nothing is narrowed (every table of the node is
    judged). A table mapped only by other processes belongs to another server (one being
    filled reads "not constant" until its fill ends): it and its findings are left out and
    named (the third value). Tables nobody maps stay: orphans are the node's hygiene, judged
    for every certify."""
    if not pids:
        return list(tables), list(findings), []
    ours = set(pids)
    others = sorted(
        str(t["name"])
        for t in tables
        if t.get("mapper_pids") and not ours & set(t.get("mapper_pids") or ())
    )
    left_out = set(others)
    kept = [t for t in tables if t["name"] not in left_out]
    said = [f for f in findings if (f.get("details") or {}).get("table") not in left_out]
    return kept, said, others


def engram_findings(
    inspect: Sequence[Mapping[str, Any]],
    orphans: Sequence[Mapping[str, Any]],
    capacity: Mapping[str, Any] | None,
    others: Sequence[str] = (),
) -> list[Finding]:
    """Findings of the Engram hygiene check: inspect, orphans and /dev/shm capacity.

    ``inspect``: engram inspect's findings; ``orphans``: engram clean's dry-run list;
    ``capacity``: the plan's {"total_bytes", "shm_free_bytes", "fits_shm", "chosen"} for the
    model's Engram tables, None when the model has none; ``others``: tables of other
    servers on this node left out (:func:`server_tables`), said as info.
    """
    out = [
        Finding(str(f["severity"]), str(f["code"]), str(f["message"]), dict(f.get("details") or {}))
        for f in inspect
    ]
    if others:
        out.append(
            Finding(
                INFO,
                "engram.other_servers",
                f"{len(others)} table(s) mapped only by other processes of this node, not "
                f"judged for this server: {', '.join(others[:5])}",
                {"tables": list(others)},
            )
        )
    if orphans:
        size = sum(int(o.get("size_bytes") or 0) for o in orphans)
        names = ", ".join(str(o["name"]) for o in orphans[:5])
        out.append(
            Finding(
                FAIL,
                "engram.orphans",
                f"{len(orphans)} orphaned Engram table(s) in /dev/shm ({size} bytes): {names}",
                {"orphans": [o["name"] for o in orphans], "hint": "opsctl engram clean --yes"},
            )
        )
    else:
        out.append(Finding(OK, "engram.no_orphans", "no orphaned Engram table in /dev/shm"))
    if capacity is None:
        out.append(Finding(INFO, "engram.not_in_model", "the model has no Engram tables"))
    elif capacity.get("fits_shm") is False:
        out.append(
            Finding(
                WARNING,
                "engram.shm_capacity",
                f"the model's Engram tables ({capacity.get('total_bytes')} bytes) do not fit "
                f"in /dev/shm ({capacity.get('shm_free_bytes')} bytes free): vLLM falls back to "
                f"{capacity.get('chosen')}",
                dict(capacity),
            )
        )
    else:
        out.append(
            Finding(OK, "engram.shm_capacity_ok", "the model's Engram tables fit in /dev/shm")
        )
    return out
