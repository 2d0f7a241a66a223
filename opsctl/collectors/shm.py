"""/dev/shm: files, capacity, and which live processes hold which segment.

A segment is *held* when a live process maps it (/proc/PID/maps) or has it open
(/proc/PID/fd): between ``shm_open``/``open`` and ``mmap`` a segment is only open, and
Python's ``SharedMemory`` keeps its descriptor for as long as it lives. Both are
matched by device + inode, so unlinked segments that live on only as "(deleted)"
mappings or descriptors are found too, and a new file that reuses a name is never
taken for the old one. A process that exits or denies access mid-scan is recorded in
``errors``, never raised; callers decide whether an unreadable process blocks a
deletion (:func:`HolderScan.denied_pids`).

:func:`remove_unheld` is the one deletion rule (engine stop, ``engram clean``,
``runs clean``): it rescans right before unlinking and removes only regular files that
no process maps or holds open and that are at least ``min_age`` seconds old.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

SHM = Path("/dev/shm")


@dataclass(frozen=True, slots=True)
class ShmFile:
    """One file in /dev/shm: name, path, size, inode, device and times."""

    name: str
    path: str
    size: int
    inode: int
    dev: int
    mtime: float
    is_symlink: bool
    ctime: float = 0.0
    allocated: int = 0  # bytes of memory the file pins (st_blocks * 512; tmpfs: RAM/swap)

    @property
    def key(self) -> tuple[tuple[int, int], int]:
        """((major, minor), inode): what names the file whatever its path."""
        return (os.major(self.dev), os.minor(self.dev)), self.inode

    def age(self, now: float) -> float:
        """Seconds since the file was created, written or changed.

        Newest of mtime and ctime: ctime moves on creation, truncate and chmod, and cannot
        be set back."""
        return now - max(self.mtime, self.ctime)


@dataclass(frozen=True, slots=True)
class Mapping:
    """One mapping of a /dev/shm file in a process (a /proc/PID/maps line)."""

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
        """The mapping's length in bytes."""
        return self.end - self.start

    @property
    def key(self) -> tuple[tuple[int, int], int]:
        """((major, minor), inode) of the mapped file."""
        major, minor = self.dev.split(":")
        return (int(major, 16), int(minor, 16)), self.inode


@dataclass(frozen=True, slots=True)
class OpenFd:
    """An open descriptor of a process on a file under the scanned prefix."""

    pid: int
    fd: int
    path: str  # without the " (deleted)" suffix
    deleted: bool
    dev: int  # st_dev of the file the descriptor refers to
    inode: int

    @property
    def key(self) -> tuple[tuple[int, int], int]:
        """((major, minor), inode) of the open file."""
        return (os.major(self.dev), os.minor(self.dev)), self.inode


@dataclass(frozen=True, slots=True)
class ShmCapacity:
    """The size, use and free space of /dev/shm, in bytes."""

    total: int
    used: int
    free: int


@dataclass(frozen=True, slots=True)
class MappingScan:
    """The /dev/shm mappings of the processes read in one look, and the ones that failed."""

    taken_at: float
    mappings: tuple[Mapping, ...]
    errors: tuple[tuple[int, str], ...]  # (pid, reason)


def capacity(root: Path = SHM) -> ShmCapacity:
    """The size, use and free space of the file system at ``root``."""
    u = shutil.disk_usage(root)
    return ShmCapacity(u.total, u.used, u.free)


def list_files(root: Path = SHM, prefix: str = "") -> list[ShmFile]:
    """The regular files of ``root`` whose names start with ``prefix``."""
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
            ShmFile(
                e.name,
                e.path,
                st.st_size,
                st.st_ino,
                st.st_dev,
                st.st_mtime,
                e.is_symlink(),
                st.st_ctime,
                st.st_blocks * 512,
            )
        )
    return sorted(out, key=lambda f: f.name)


def parse_maps_line(pid: int, line: str) -> Mapping | None:
    """One /proc/PID/maps line as a :class:`Mapping`; None when the line has no path field."""
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
    """Every process id visible in /proc, ascending."""
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


def scan_targets(pids: list[int] | None) -> list[int]:
    """The processes a scan reads: ``pids`` as given, or every other visible process."""
    if pids is not None:
        return list(pids)
    me = os.getpid()
    return [pid for pid in all_pids() if pid != me]


def scan_mappings(pids: list[int] | None = None, path_prefix: str = str(SHM) + "/") -> MappingScan:
    """The mappings of files under ``path_prefix`` in ``pids`` (default: every other process)."""
    maps: list[Mapping] = []
    errors: list[tuple[int, str]] = []
    for pid in scan_targets(pids):
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
    """The paths of every mapped file in ``scan``."""
    return {m.path for m in scan.mappings}


def read_fds(pid: int, path_prefix: str = str(SHM) + "/") -> list[OpenFd]:
    """Open descriptors of one process on files whose path starts with ``path_prefix``.

    Linked files or "(deleted)" ones. Raises OSError when /proc/PID/fd cannot be listed;
    a descriptor closed while it is read is skipped."""
    out = []
    base = f"/proc/{pid}/fd"
    for entry in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{entry}")
            if not target.startswith(path_prefix):
                continue
            st = os.stat(f"{base}/{entry}")  # the open file itself, deleted or not
        except FileNotFoundError:
            continue
        deleted = target.endswith(" (deleted)")
        if deleted:
            target = target[: -len(" (deleted)")]
        out.append(OpenFd(pid, int(entry), target, deleted, st.st_dev, st.st_ino))
    return out


@dataclass(frozen=True, slots=True)
class HolderScan:
    """Every mapping and open descriptor of files under one prefix, over the processes read.

    The processes read are all those visible here, or the given ones; the scan lists those that
    could not be read."""

    taken_at: float
    mappings: tuple[Mapping, ...]
    fds: tuple[OpenFd, ...]
    errors: tuple[tuple[int, str], ...]  # (pid, reason): maps or fd unreadable, or exited

    def holders(self, f: ShmFile) -> dict[int, set[str]]:
        """pid -> {"mapped", "open"} for every process holding the file ``f``."""
        out: dict[int, set[str]] = {}
        for m in self.mappings:
            if m.key == f.key or (not m.deleted and m.path == f.path):
                out.setdefault(m.pid, set()).add("mapped")
        for d in self.fds:
            if d.key == f.key:
                out.setdefault(d.pid, set()).add("open")
        return out

    def held_keys(self) -> set[tuple[tuple[int, int], int]]:
        """((major, minor), inode) of every file some process maps or has open."""
        return {m.key for m in self.mappings} | {d.key for d in self.fds}

    def held_paths(self) -> set[str]:
        """Linked paths some process maps or has open."""
        return {m.path for m in self.mappings if not m.deleted} | {
            d.path for d in self.fds if not d.deleted
        }

    def is_held(self, f: ShmFile) -> bool:
        """Whether some process maps ``f`` or has it open (by inode or by path)."""
        return f.key in self.held_keys() or f.path in self.held_paths()

    @property
    def denied_pids(self) -> tuple[int, ...]:
        """Processes whose maps or descriptors could not be read (not: exited ones)."""
        return tuple(sorted({pid for pid, reason in self.errors if "permission" in reason}))


def scan_holders(pids: list[int] | None = None, path_prefix: str = str(SHM) + "/") -> HolderScan:
    """Mappings and open descriptors of files under ``path_prefix``.

    Read from /proc/PID/maps and /proc/PID/fd; without ``pids``, of every process visible here
    except this one."""
    maps = scan_mappings(pids, path_prefix)
    fds: list[OpenFd] = []
    errors = list(maps.errors)
    for pid in scan_targets(pids):
        try:
            fds.extend(read_fds(pid, path_prefix))
        except (FileNotFoundError, ProcessLookupError):
            errors.append((pid, "process exited during scan"))
        except PermissionError as exc:
            errors.append((pid, f"permission denied reading /proc/{pid}/fd: {exc.strerror}"))
        except OSError as exc:
            errors.append((pid, f"cannot read /proc/{pid}/fd: {exc}"))
    return HolderScan(time.time(), maps.mappings, tuple(fds), tuple(dict.fromkeys(errors)))


def remove_unheld(
    names: set[str] | list[str],
    root: Path | None = None,
    *,
    min_age: float = 0.0,
    now: float | None = None,
) -> tuple[list[str], list[str]]:
    """Remove the given files of ``root`` that nothing holds; (removed, kept).

    ``root``: /dev/shm by default. Kept: what a live process maps or holds open, what is
    younger than ``min_age`` seconds, symlinks and other non-regular files. Holders are
    rescanned right before. Unreadable processes do not block here: callers that cannot
    vouch for the files check :attr:`HolderScan.denied_pids` first. Returns (removed, kept)."""
    if not names:
        return [], []
    root = SHM if root is None else root
    scan = scan_holders(path_prefix=f"{root}/")
    keys, paths = scan.held_keys(), scan.held_paths()
    now = time.time() if now is None else now
    removed, kept = [], []
    for name in sorted(set(names)):
        if "/" in name or name in ("", ".", ".."):
            kept.append(name)
            continue
        path = root / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        key = ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
        young = now - max(st.st_mtime, st.st_ctime) < min_age
        if not stat.S_ISREG(st.st_mode) or key in keys or str(path) in paths or young:
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


def rank_segments(tmp_dir: Path | str | None, root: Path = SHM) -> set[str]:
    """The /dev/shm segments of the engine whose private TMPDIR is ``tmp_dir``.

    Its CPU ranks' (named after the rendezvous file in that directory) and the ring
    buffers its processes wrote down there as made (``engine_patches.run_segments``)."""
    from engine_patches import run_segments

    return set(run_segments.run_names(tmp_dir, str(root)))
