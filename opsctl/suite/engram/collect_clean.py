"""Orphaned Engram tables in /dev/shm: what ``engram clean`` lists and removes.

Files no live process visible here maps or holds open, older than a minimum age. Decisions
(:func:`opsctl.suite.engram.judge.segment_status`, the refusal rule) are the domain's; the one
deletion rule is :func:`opsctl.collectors.shm.remove_unheld`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.collectors import shm
from opsctl.suite.engram import judge


@dataclass(frozen=True, slots=True)
class Orphan:
    """An Engram table file no live process maps or holds open."""

    name: str
    path: str
    size: int
    mtime: float
    age: float = 0.0  # seconds since created / written / changed


@dataclass(frozen=True, slots=True)
class CleanScan:
    """What a clean scan found: orphans, held and young files, unreadable processes."""

    orphans: tuple[Orphan, ...]
    mapped: tuple[str, ...]  # files some live process maps
    symlinks: tuple[str, ...]
    denied_pids: tuple[int, ...]  # processes whose maps or fds could not be read
    open: tuple[str, ...] = ()  # files some live process holds open without mapping them
    young: tuple[Orphan, ...] = ()  # unheld, but younger than the minimum age: kept


def find_orphans(
    prefix: str = judge.PREFIX,
    root: Path = shm.SHM,
    min_age: float = judge.DEFAULT_MIN_AGE,
    now: float | None = None,
) -> CleanScan:
    """Engram table files no live process visible here maps or holds open, old enough.

    Files ``<root>/<prefix>*``, held by device + inode or by path, at least ``min_age`` seconds
    old (:func:`opsctl.suite.engram.judge.segment_status`). Processes in other PID namespaces (other
    containers sharing this /dev/shm) are not in this /proc at all, so what they hold cannot be
    seen: run clean in the namespace of the vLLM processes. Processes whose maps or fds cannot
    be read are listed in ``denied_pids``; files they hold would look orphaned."""
    files = shm.list_files(root, prefix)
    scan = shm.scan_holders(None, path_prefix=f"{root}/{prefix}")
    now = time.time() if now is None else now
    keys, paths = scan.held_keys(), scan.held_paths()
    map_keys = {m.key for m in scan.mappings}
    map_paths = {m.path for m in scan.mappings if not m.deleted}
    orphans, young, mapped, opened, links = [], [], [], [], []
    for f in files:
        held = f.key in keys or f.path in paths
        status = judge.segment_status(held, f.is_symlink, f.age(now), min_age)
        if status == "symlink":
            links.append(f.name)
        elif status == "in-use":
            (mapped if f.key in map_keys or f.path in map_paths else opened).append(f.name)
        else:
            o = Orphan(f.name, f.path, f.size, f.mtime, round(f.age(now), 3))
            (orphans if status == "orphan" else young).append(o)
    return CleanScan(
        tuple(orphans), tuple(mapped), tuple(links), scan.denied_pids, tuple(opened), tuple(young)
    )


def remove_orphans(
    names: list[str],
    prefix: str = judge.PREFIX,
    root: Path = shm.SHM,
    force: bool = False,
    min_age: float = judge.DEFAULT_MIN_AGE,
) -> tuple[list[str], list[str], tuple[int, ...]]:
    """Remove orphans, re-checking each right before; (removed, kept, unreadable pids).

    shm.remove_unheld rescans maps and fds and refuses symlinks, non-regular files, anything
    held and anything younger than ``min_age``. When some process's maps or fds cannot be read,
    nothing is removed unless ``force``: a file only it holds would look orphaned."""
    wanted = {n for n in names if n.startswith(prefix) and "/" not in n}
    again = find_orphans(prefix, root, min_age)
    if again.denied_pids and not force:
        return [], sorted(wanted), again.denied_pids
    orphans = {o.name for o in again.orphans}
    removed, kept = shm.remove_unheld(wanted & orphans, root, min_age=min_age)
    return removed, sorted([*kept, *(wanted - orphans)]), again.denied_pids
