"""Drill-in details of a LOCAL endpoint, read only while an operator looks at it.

They cost more than a poll: the process tree with roles and CPU/RSS/PSS, the Engram
tables its processes map (read-only, no verification), and for opsctl runs the patch
ledger and the log tail. Field names match the serve panels (tree, ledger, log_tail) so
the console reuses them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.collectors import ledger
from opsctl.collectors.processes import ProcessTree, snapshot_tree
from opsctl.console.judge import Target


@dataclass(frozen=True, slots=True)
class EngramRow:
    """One Engram table a local endpoint's processes map: size, link, mappers, RSS/PSS."""

    name: str
    size: int | None
    linked: bool
    mapper_pids: tuple[int, ...]
    rss: int | None
    pss: int | None


@dataclass(frozen=True, slots=True)
class LocalDetail:
    """A local endpoint's drill-in: process tree, Engram tables, ledger, log tail."""

    taken_at: float
    tree: ProcessTree
    engram: tuple[EngramRow, ...]
    ledger: tuple[ledger.LedgerEntry, ...]
    log_tail: tuple[str, ...]
    errors: tuple[str, ...] = ()


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v or 0 for v in values)


def engram_rows(pids: list[int]) -> tuple[tuple[EngramRow, ...], tuple[str, ...]]:
    """The Engram tables the processes ``pids`` map, and any error reading them."""
    from opsctl.suite.engram import collect

    try:
        snap = collect.inspect(pids=pids, verify="none")
    except (OSError, ValueError) as exc:
        return (), (f"engram: {exc}",)
    rows = []
    for t in snap.tables:
        mine = [m for m in t.mappers if m.pid in pids]
        if not mine:
            continue
        rows.append(
            EngramRow(
                t.name,
                t.size,
                t.linked,
                tuple(sorted({m.pid for m in mine})),
                _sum([m.rss for m in mine]),
                _sum([m.pss for m in mine]),
            )
        )
    errors = tuple(f"pid {pid}: {why}" for pid, why in snap.scan_errors if pid in pids)
    return tuple(rows), errors


def _log_tail(run_dir: str | None, n: int = 12) -> tuple[str, ...]:
    if not run_dir:
        return ()
    from opsctl.serve.collect import quiet_tail

    path = Path(run_dir) / "server.log"
    try:
        with path.open("rb") as fh:  # the end only: logs grow long
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(quiet_tail(text, n))


def collect_detail(target: Target) -> LocalDetail | None:
    """None for a remote endpoint (nothing local to show)."""
    if target.pid is None:
        return None
    tree = snapshot_tree(target.pid)
    pids = [p.pid for p in tree.processes]
    engram_tables, errors = engram_rows(pids) if pids else ((), ())
    entries: tuple[ledger.LedgerEntry, ...] = ()
    if target.run_dir:
        entries = ledger.entries(ledger.read_records(Path(target.run_dir)))
    if not tree.processes:
        errors = (*errors, f"process {target.pid} is gone")
    return LocalDetail(time.time(), tree, engram_tables, entries, _log_tail(target.run_dir), errors)
