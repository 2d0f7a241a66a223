"""Read the per-process patch ledger that engine_patches writes into a run directory.

Each record also says which test-only knobs its process honoured (``test_knobs``,
engine_patches.knobs): :func:`test_knobs` is how opsctl learns from the engine itself,
not from its own launch options, that a run was altered on purpose."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One patch of one engine process as its ledger records it (and how it went)."""

    pid: int
    role: str
    vllm_version: str
    name: str
    status: str
    detail: str
    reason: str
    target: str


def read_records(run_dir: Path) -> list[dict]:
    """Every ledger record of the run (one per process); a file being written is skipped."""
    out = []
    for f in sorted((run_dir / "ledger").glob("*.json")):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue  # being written; the next poll sees it
    return sorted(out, key=lambda r: (r.get("time", 0), r.get("pid", 0)))


def entries(records: list[dict]) -> tuple[LedgerEntry, ...]:
    """One entry per patch of every ledger record."""
    rows = []
    for r in records:
        for p in r.get("patches", []):
            rows.append(
                LedgerEntry(
                    int(r.get("pid", 0)),
                    str(r.get("role", "?")),
                    str(r.get("vllm_version", "?")),
                    str(p.get("name")),
                    str(p.get("status")),
                    str(p.get("detail", "")).splitlines()[0] if p.get("detail") else "",
                    str(p.get("reason", "")),
                    str(p.get("target", "")),
                )
            )
    return tuple(rows)


def test_knobs(records: list[dict]) -> dict[str, str]:
    """The test knobs any process of the run honoured (name -> value); ``{}`` when none.

    Also ``{}`` for ledgers written before knobs were recorded."""
    out: dict[str, str] = {}
    for r in records:
        knobs = r.get("test_knobs")
        if isinstance(knobs, dict):
            out.update({str(k): str(v) for k, v in knobs.items()})
    return out


def knobs_of(run_dirs: Iterable[str | Path | None]) -> dict[str, str]:
    """The test knobs the engines of these run directories honoured, from their ledgers.

    Read from their ledgers (the engine's own record); ``None`` entries (no run dir) are
    skipped."""
    knobs: dict[str, str] = {}
    for rd in run_dirs:
        if rd:
            knobs.update(test_knobs(read_records(Path(rd))))
    return knobs


def read_events(run_dir: Path, kind: str) -> list[dict]:
    """The events of ``kind`` the run's probes appended (one JSON object a line)."""
    path = run_dir / "events" / f"{kind}.jsonl"
    out = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def latest_run(runs_root: Path) -> Path | None:
    """The run under ``runs_root`` with a ledger that changed last; None when none has one."""
    runs = [p for p in runs_root.glob("*") if (p / "ledger").is_dir()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None
