"""Read the per-process patch ledger that engine_patches writes into a run directory.

Each record names its process's rank: ``title`` is vLLM's title (``VLLM::Worker_TP1``,
rewritten by the engine once vLLM set it); :func:`with_ranks` adds ``rank`` (the role:
``Worker_TP1``, ``EngineCore_DP1``, a DP engine's plain worker as ``Worker_DP1`` from its
parent record, ``APIServer``), from the title, else, for a ledger without titles, from
the live process's title while it runs.

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
    rank: str = ""  # the process's rank role (Worker_TP1, EngineCore_DP1...); "" unknown

    @property
    def who(self) -> str:
        """The rank role when known, else the process kind (``engine_core``)."""
        return self.rank or self.role


def read_records(run_dir: Path) -> list[dict]:
    """Every ledger record of the run (one per process); a file being written is skipped."""
    out = []
    for f in sorted((run_dir / "ledger").glob("*.json")):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue  # being written; the next poll sees it
    return sorted(out, key=lambda r: (r.get("time", 0), r.get("pid", 0)))


def _live_title(record: dict) -> str:
    """The title of the record's process while it still runs as that process."""
    import psutil

    try:
        p = psutil.Process(int(record.get("pid") or 0))
        if p.create_time() > float(record.get("time") or 0) + 1.0:
            return ""  # the pid now belongs to a process started after the record
        return " ".join(p.cmdline())
    except (psutil.Error, ValueError, TypeError):
        return ""


def with_ranks(records: list[dict]) -> list[dict]:
    """The records in rank order, each with ``rank`` (its role; "" when unknown)."""
    from opsctl.domain import ranks

    filled = []
    for r in records:
        if not r.get("title") and r.get("role") not in ("api_server", "model_inspector"):
            r = {**r, "title": _live_title(r)}
        filled.append(r)
    roles = ranks.record_roles(filled)
    out = [{**r, "rank": roles.get(int(r.get("pid") or 0), "")} for r in records]
    return ranks.by_rank(out, lambda r: r["rank"] or "~" + str(r.get("role", "")))


def entries(records: list[dict]) -> tuple[LedgerEntry, ...]:
    """One entry per patch of every ledger record, in rank order."""
    rows = []
    for r in with_ranks(records):
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
                    r["rank"],
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
