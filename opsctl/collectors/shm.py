"""/dev/shm: files, capacity, and which live processes map which segment.

Mappings are read from /proc/PID/maps, so unlinked segments that live on only as
"(deleted)" mappings are found too. A process that exits or denies access mid-scan is
recorded in ``errors``, never raised.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

SHM = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class ShmFile:
    name: str
    path: str
    size: int
    inode: int
    dev: int
    mtime: float
    is_symlink: bool


@dataclass(frozen=True, slots=True)
class Mapping:
    pid: int
    start: int
    end: int
    perms: str
    offset: int
    dev: str  # "major:minor" in hex, as /proc/PID/maps prints it
    inode: int
    path: str  # without the " (deleted)" suffix
    deleted: bool

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class ShmCapacity:
    total: int
    used: int
    free: int


@dataclass(frozen=True, slots=True)
class MappingScan:
    taken_at: float
    mappings: tuple[Mapping, ...]
    errors: tuple[tuple[int, str], ...]  # (pid, reason)


def capacity(root: Path = SHM) -> ShmCapacity:
    u = shutil.disk_usage(root)
    return ShmCapacity(u.total, u.used, u.free)


def list_files(root: Path = SHM, prefix: str = "") -> list[ShmFile]:
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for e in entries:
        if not e.name.startswith(prefix):
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if e.is_dir(follow_symlinks=False):
            continue
        out.append(
            ShmFile(e.name, e.path, st.st_size, st.st_ino, st.st_dev, st.st_mtime, e.is_symlink())
        )
    return sorted(out, key=lambda f: f.name)


def parse_maps_line(pid: int, line: str) -> Mapping | None:
    parts = line.split(maxsplit=5)
    if len(parts) < 6:
        return None
    addr, perms, offset, dev, inode, path = parts
    path = path.rstrip("\n")
    deleted = path.endswith(" (deleted)")
    if deleted:
        path = path[: -len(" (deleted)")]
    start, end = (int(x, 16) for x in addr.split("-"))
    return Mapping(pid, start, end, perms, int(offset, 16), dev, int(inode), path, deleted)


def read_maps(pid: int, path_prefix: str = str(SHM) + "/") -> list[Mapping]:
    """Mappings of one process whose path starts with ``path_prefix``. Raises OSError."""
    out = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if path_prefix not in line:
                continue
            m = parse_maps_line(pid, line)
            if m is not None and m.path.startswith(path_prefix):
                out.append(m)
    return out


def all_pids() -> list[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


def scan_mappings(pids: list[int] | None = None, path_prefix: str = str(SHM) + "/") -> MappingScan:
    maps: list[Mapping] = []
    errors: list[tuple[int, str]] = []
    me = os.getpid()
    for pid in pids if pids is not None else all_pids():
        if pid == me and pids is None:
            continue
        try:
            maps.extend(read_maps(pid, path_prefix))
        except FileNotFoundError:
            errors.append((pid, "process exited during scan"))
        except ProcessLookupError:
            errors.append((pid, "process exited during scan"))
        except PermissionError as exc:
            errors.append((pid, f"permission denied reading /proc/{pid}/maps: {exc.strerror}"))
        except OSError as exc:
            errors.append((pid, f"cannot read /proc/{pid}/maps: {exc}"))
    return MappingScan(time.time(), tuple(maps), tuple(errors))


def mapped_paths(scan: MappingScan) -> set[str]:
    return {m.path for m in scan.mappings}


def remove_unmapped(names: set[str], root: Path = SHM) -> tuple[list[str], list[str]]:
    """Remove the given /dev/shm files unless a live process maps them (or they are
    symlinks / not regular files). Returns (removed, kept)."""
    if not names:
        return [], []
    mapped = mapped_paths(scan_mappings())
    removed, kept = [], []
    for name in sorted(names):
        path = root / name
        if "/" in name or str(path) in mapped or path.is_symlink() or not path.is_file():
            kept.append(name)
            continue
        try:
            path.unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(name)
    return removed, kept
