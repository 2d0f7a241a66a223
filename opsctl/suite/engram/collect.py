"""Engram host tables as they exist on this node: /dev/shm files and live mappings.

One :func:`inspect` call reads once and returns a frozen :class:`InspectSnapshot`:

- files named ``vllm_engram_*`` in /dev/shm, and mappings of such files held by live
  processes (``/proc/PID/maps``), including unlinked "(deleted)" ones;
- mappings grouped per table by device + inode (a file and its mappings are one table);
- per mapping process: RSS and PSS of that mapping from ``/proc/PID/smaps`` (PSS ≈
  size / N when N processes really share one copy);
- the table's size: the linked file's size, else ``stat`` of
  ``/proc/PID/map_files/<range>`` (the deleted file; needs CAP_SYS_ADMIN), else from the
  mapping's last page read through ``/proc/PID/mem`` (one past the last non-zero byte,
  :func:`opsctl.suite.engram.judge.size_from_mapping`); ``size_source`` says which;
- the block size (32 in vLLM 0.32, or 128): from the size, else from the bytes at the
  candidate boundaries (read here, :func:`opsctl.suite.engram.judge.boundary_windows`), else
  32 (:func:`opsctl.suite.engram.judge.decide_layout`), or forced;
- fill verification: the table is only ever read with ``pread`` (``os.preadv`` into one
  reusable 256 KiB buffer) and never mapped: inspect adds no mapping, never faults in
  holes, and a table truncated while it is read gives a short read (reported as an
  error), never SIGBUS. Sources, best first: the linked file, else
  ``/proc/PID/map_files/<range>`` (needs CAP_SYS_ADMIN), else ``/proc/PID/mem`` at the
  mapping's address (needs ptrace access). A chunk is compared with the constant as
  ``bytearray == bytes`` (memcmp); numpy locates the first differing byte only when a
  chunk differs.

A process that exits mid-scan or denies access becomes a field with a reason (and the
next mapping process is tried), never an exception.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opsctl.collectors import shm
from opsctl.suite.engram import judge

CHUNK = 256 * 1024  # stays in L2: pread + compare run at ~4 GB/s here (4 MiB: ~2.8)
_PATTERNS: dict[int, bytes] = {}


def _pattern(value: int) -> bytes:
    """CHUNK bytes of ``value``."""
    if value not in _PATTERNS:
        _PATTERNS[value] = bytes([value]) * CHUNK
    return _PATTERNS[value]


@dataclass(frozen=True, slots=True)
class MapperInfo:
    """One process that maps an Engram table: its ranges, permissions and resident bytes."""

    pid: int
    name: str
    ranges: tuple[tuple[int, int, int], ...]  # (start, end, file offset)
    perms: str
    deleted: bool
    rss: int | None  # bytes, summed over this process's mappings of the table
    pss: int | None
    locked: int | None
    vmflags: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class VerifyResult:
    # constant | mismatch | skipped (--verify none, or the table went away) | denied |
    # error | unverifiable (size or layout unknown)
    """How verifying a table's constant fill went: status, reader, bytes and time."""

    status: str
    mode: str
    access: str | None = None  # file | map_files | mem
    bytes_checked: int = 0
    seconds: float = 0.0
    first_mismatch: dict[str, Any] | None = None
    reason: str | None = None
    error: str | None = None
    hint: str | None = None

    @property
    def gbps(self) -> float | None:
        """Bytes verified per second, in GB/s; None when no time was measured."""
        return self.bytes_checked / self.seconds / 1e9 if self.seconds > 0 else None


@dataclass(frozen=True, slots=True)
class TableReport:
    """One Engram table as found: its file, size, layout, mappers and verification."""

    name: str
    path: str
    dev: str  # "major:minor"
    inode: int
    linked: bool
    size: int | None
    size_source: str  # file | map_files | mapping (last page via /proc/PID/mem) | unknown
    layout: judge.TableLayout | None
    block_choice: dict[str, Any]  # judge.LayoutDecision.to_dict(): block, how, detail
    mappers: tuple[MapperInfo, ...]
    verify: VerifyResult

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: units in the names (``size_bytes``, ``rss_bytes``, ...)."""
        d = _renamed(asdict(self), {"size": "size_bytes"})
        if d["layout"] is not None:
            d["layout"] = _renamed(d["layout"], {"total": "total_bytes"})
        d["mappers"] = [_renamed(asdict(m), MAPPER_NAMES) for m in self.mappers]
        d["mapper_pids"] = sorted({m.pid for m in self.mappers})
        d["verify"] = {**_renamed(asdict(self.verify), VERIFY_NAMES), "gbps": self.verify.gbps}
        return d


# dataclass field -> JSON name (opsctl.engram.inspect/2: units in the names)
MAPPER_NAMES = {"rss": "rss_bytes", "pss": "pss_bytes", "locked": "locked_bytes"}
VERIFY_NAMES = {"bytes_checked": "checked_bytes", "seconds": "duration_s"}


def _renamed(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {names.get(k, k): v for k, v in d.items()}


@dataclass(frozen=True, slots=True)
class InspectSnapshot:
    """Every Engram table found in one look, with /dev/shm's capacity and scan errors."""

    taken_at: float
    prefix: str
    tables: tuple[TableReport, ...]
    capacity: shm.ShmCapacity
    scan_errors: tuple[tuple[int, str], ...]
    symlinks: tuple[str, ...] = field(default_factory=tuple)


Progress = Callable[[str, dict[str, Any]], None]


def _devkey_from_st(st_dev: int) -> tuple[int, int]:
    return os.major(st_dev), os.minor(st_dev)


def _devkey_from_maps(dev: str) -> tuple[int, int]:
    major, minor = dev.split(":")
    return int(major, 16), int(minor, 16)


def read_smaps(pid: int, starts: set[int]) -> dict[int, dict[str, Any]]:
    """Rss/Pss/Locked (bytes) and VmFlags of the mappings of ``pid`` starting at ``starts``."""
    out: dict[int, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            head = line.split(maxsplit=1)[0] if line.strip() else ""
            if "-" in head and not head.endswith(":"):
                start = int(head.split("-")[0], 16)
                cur = out.setdefault(start, {}) if start in starts else None
                continue
            if cur is None:
                continue
            key, _, rest = line.partition(":")
            if key == "VmFlags":
                cur["vmflags"] = rest.strip()
            elif key in ("Rss", "Pss", "Locked", "Swap"):
                cur[key.lower()] = int(rest.split()[0]) * 1024
    return out


def _process_name(pid: int) -> str:
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:
        return "?"


def _mappers(pid: int, maps: list[shm.Mapping]) -> MapperInfo:
    name = _process_name(pid)
    ranges = tuple((m.start, m.end, m.offset) for m in maps)

    def unreadable(reason: str) -> MapperInfo:
        return MapperInfo(
            pid, name, ranges, maps[0].perms, maps[0].deleted, None, None, None, None, reason
        )

    try:
        sm = read_smaps(pid, {m.start for m in maps})
    except (FileNotFoundError, ProcessLookupError):
        return unreadable("process exited during scan")
    except PermissionError as exc:
        return unreadable(f"permission denied reading /proc/{pid}/smaps: {exc.strerror}")
    except OSError as exc:
        return unreadable(f"cannot read /proc/{pid}/smaps: {exc}")
    if not sm:  # maps said it was there, smaps no longer: unmapped or exited in between
        return unreadable("mapping went away during scan")

    def total(key: str) -> int | None:
        vals = [v[key] for v in sm.values() if key in v]
        return sum(vals) if vals else None

    flags = next((v.get("vmflags") for v in sm.values() if v.get("vmflags")), None)
    return MapperInfo(
        pid,
        name,
        ranges,
        maps[0].perms,
        maps[0].deleted,
        total("rss"),
        total("pss"),
        total("locked"),
        flags,
    )


def missing_pids(pids: tuple[int, ...] | list[int]) -> list[int]:
    """The pids among ``pids`` that name no process now."""
    import psutil

    return [p for p in pids if not psutil.pid_exists(p)]


# ---- readers ---------------------------------------------------------------------------------


class _Reader:
    """Reads a table with pread only: ``base`` is added to table offsets (mem: the
    mapping's address). Never maps the table (see the module doc)."""

    def __init__(self, fd: int, access: str, base: int = 0) -> None:
        self.fd, self.access, self.base = fd, access, base

    def readinto(self, buf: memoryview, offset: int) -> int:
        return os.preadv(self.fd, [buf], self.base + offset)

    def read(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at table ``offset``; OSError when the table is shorter."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.readinto(view[got:], offset + got)
            if k <= 0:
                raise OSError(f"table ends at byte {offset + got}, expected {offset + n}")
            got += k
        return bytes(buf)

    def close(self) -> None:
        os.close(self.fd)


ACCESS = ("file", "map_files", "mem")


def _open_readers(
    table_path: str,
    linked: bool,
    devkey: tuple[int, int],
    inode: int,
    mappers: tuple[MapperInfo, ...],
    size: int | None,
    access: tuple[str, ...] = ACCESS,
) -> Iterator[_Reader | Exception]:
    """Candidate readers, best first; an exception in place of a reader says why one failed."""
    if linked and "file" in access:
        try:
            fd = os.open(table_path, os.O_RDONLY | os.O_NOFOLLOW)
            st = os.fstat(fd)
            if (_devkey_from_st(st.st_dev), st.st_ino) != (devkey, inode):
                os.close(fd)
                yield FileNotFoundError(f"{table_path} was replaced during the scan")
            else:
                yield _Reader(fd, "file")
        except OSError as exc:
            yield exc
    for m in mappers:
        for start, end, offset in m.ranges:
            if "map_files" in access:
                try:
                    fd = os.open(f"/proc/{m.pid}/map_files/{start:x}-{end:x}", os.O_RDONLY)
                    yield _Reader(fd, "map_files")
                    continue
                except OSError as exc:
                    yield exc
            if "mem" not in access or offset != 0 or (size is not None and end - start < size):
                continue  # /proc/PID/mem needs the whole table in this one mapping
            try:
                fd = os.open(f"/proc/{m.pid}/mem", os.O_RDONLY)
                yield _Reader(fd, "mem", base=start)
            except OSError as exc:
                yield exc


def check_regions(
    reader: _Reader, regions: list[judge.Region]
) -> tuple[int, dict[str, Any] | None]:
    """Compare every byte of ``regions`` with its constant; (bytes checked, first mismatch).

    Raises OSError when the reader fails or the table is shorter than ``regions`` (e.g.
    truncated while being read)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    checked = 0
    for region in regions:
        pattern = _pattern(region.value)
        off = region.start
        while off < region.end:
            want = min(CHUNK, region.end - off)
            n = reader.readinto(view[:want] if want < CHUNK else view, off)
            if n <= 0:
                raise OSError(f"table ends at byte {off}, expected {region.end}")
            idx = (
                None
                if (n == CHUNK and buf == pattern)
                else judge.first_mismatch(view[:n], region.value)
            )
            if idx is not None:
                return checked + idx + 1, {
                    "offset": off + idx,
                    "value": buf[idx],
                    "expected": region.value,
                    "region": region.name,
                }
            checked += n
            off += n
    return checked, None


_DENIED_HINT = (
    "run as root (opening /proc/PID/map_files needs CAP_SYS_ADMIN; /proc/PID/mem needs "
    "ptrace access to the vLLM process) or as the user that runs vLLM"
)


def verify_table(
    path: str,
    linked: bool,
    devkey: tuple[int, int],
    inode: int,
    mappers: tuple[MapperInfo, ...],
    size: int | None,
    mode: str,
    access: tuple[str, ...] = ACCESS,
    block: int | None = None,
    size_error: Exception | None = None,
) -> tuple[judge.LayoutDecision, VerifyResult]:
    """Decide a table's layout and verify its fill in ``mode``, by the first reader that works.

    The boundary bytes are read when the size fits several block sizes."""
    failures: list[Exception] = [size_error] if size_error is not None else []
    if size:
        for cand in _open_readers(path, linked, devkey, inode, mappers, size, access):
            if isinstance(cand, Exception):
                failures.append(cand)
                continue
            try:
                seen = {w: cand.read(*w) for w in judge.boundary_windows(size, block)}
                decision = judge.decide_layout(size, seen, forced=block)
                if mode == "none":
                    return decision, VerifyResult("skipped", mode, cand.access)
                if decision.layout is None:
                    return decision, VerifyResult("unverifiable", mode, reason=decision.detail)
                started = time.perf_counter()
                checked, mismatch = check_regions(cand, judge.verify_plan(decision.layout, mode))
                secs = time.perf_counter() - started
            except OSError as exc:  # process exited mid-read, file went away or shrank
                failures.append(exc)
                continue
            finally:
                cand.close()
            status = "mismatch" if mismatch else "constant"
            return decision, VerifyResult(status, mode, cand.access, checked, secs, mismatch)
    decision = judge.decide_layout(size, None, forced=block)
    if mode == "none":
        return decision, VerifyResult("skipped", mode)
    denied = [f for f in failures if isinstance(f, PermissionError)]
    if denied:
        return decision, VerifyResult(
            "denied", mode, error=f"permission denied: {denied[0]}", hint=_DENIED_HINT
        )
    if (not mappers and not linked) or (
        failures and all(isinstance(f, FileNotFoundError | ProcessLookupError) for f in failures)
    ):
        return decision, VerifyResult(
            "skipped", mode, reason="every process mapping it exited during the scan"
        )
    if decision.layout is None:
        return decision, VerifyResult("unverifiable", mode, reason=decision.detail)
    if failures:
        return decision, VerifyResult("error", mode, error=str(failures[-1]))
    return decision, VerifyResult("error", mode, error="no way to read the table from here")


# ---- inspect ---------------------------------------------------------------------------------


def _exact_size(mappers: tuple[MapperInfo, ...]) -> int | None:
    for m in mappers:
        for start, end, _off in m.ranges:
            with contextlib.suppress(OSError):
                return os.stat(f"/proc/{m.pid}/map_files/{start:x}-{end:x}").st_size
    return None


def _size_from_tail(
    mappers: tuple[MapperInfo, ...], access: tuple[str, ...]
) -> tuple[int | None, Exception | None]:
    """Size of a deleted table from the last page of a whole-table mapping (offset 0),
    read through /proc/PID/mem. Returns (size or None, the last error)."""
    error: Exception | None = None
    if "mem" not in access:
        return None, None
    for m in mappers:
        for start, end, offset in m.ranges:
            if offset != 0:
                continue
            n = min(judge.PAGE, end - start)
            try:
                fd = os.open(f"/proc/{m.pid}/mem", os.O_RDONLY)
            except OSError as exc:
                error = exc
                continue
            reader = _Reader(fd, "mem", base=start)
            try:
                tail = reader.read(end - start - n, n)
            except OSError as exc:
                error = exc
                continue
            finally:
                reader.close()
            size = judge.size_from_mapping(end - start, tail)
            if size is not None:
                return size, None
    return None, error


def inspect(
    pids: list[int] | None = None,
    verify: str = "sample",
    prefix: str = judge.PREFIX,
    root: Path = shm.SHM,
    progress: Progress | None = None,
    access: tuple[str, ...] = ACCESS,
    block: int | None = None,
) -> InspectSnapshot:
    """Find, measure and verify every Engram table visible from here (see module doc).

    ``access`` limits how tables are read (and sized); ``block`` forces the block size."""
    if verify not in judge.VERIFY_MODES:
        raise ValueError(f"verify must be one of {judge.VERIFY_MODES}")
    notify = progress or (lambda _stage, _data: None)
    files = shm.list_files(root, prefix)
    symlinks = tuple(f.name for f in files if f.is_symlink)
    files = [f for f in files if not f.is_symlink]
    scan = shm.scan_mappings(pids, path_prefix=f"{root}/{prefix}")
    notify("maps", {"mappings": len(scan.mappings), "files": len(files)})

    groups: dict[tuple[tuple[int, int], int], dict[int, list[shm.Mapping]]] = {}
    for m in scan.mappings:
        groups.setdefault((_devkey_from_maps(m.dev), m.inode), {}).setdefault(m.pid, []).append(m)
    by_key = {(_devkey_from_st(f.dev), f.inode): f for f in files}
    keys = list(dict.fromkeys([*by_key, *groups]))

    tables: list[TableReport] = []
    for key in keys:
        devkey, inode = key
        f = by_key.get(key)
        mappers = tuple(_mappers(pid, maps) for pid, maps in sorted(groups.get(key, {}).items()))
        any_map = next((m for maps in groups.get(key, {}).values() for m in maps), None)
        path = f.path if f else (any_map.path if any_map else "")
        linked = f is not None
        size_error: Exception | None = None
        if f is not None:
            size, source = f.size, "file"
        else:
            size, source = (_exact_size(mappers) if "map_files" in access else None), "map_files"
            if size is None:
                (size, size_error), source = _size_from_tail(mappers, access), "mapping"
            if size is None:
                source = "unknown"
        name = os.path.basename(path)
        notify("verify", {"table": name, "size": size, "mode": verify})
        decision, result = verify_table(
            path, linked, devkey, inode, mappers, size, verify, access, block, size_error
        )
        tables.append(
            TableReport(
                name,
                path,
                f"{devkey[0]}:{devkey[1]}",
                inode,
                linked,
                size,
                source,
                decision.layout,
                decision.to_dict(),
                mappers,
                result,
            )
        )
    return InspectSnapshot(
        time.time(), prefix, tuple(tables), shm.capacity(root), scan.errors, symlinks
    )


def snapshot_to_dict(snap: InspectSnapshot) -> dict[str, Any]:
    """The inspect snapshot as the JSON document ``engram inspect --json`` prints."""
    return {
        "taken_at": snap.taken_at,
        "prefix": snap.prefix,
        "shm": {
            "total_bytes": snap.capacity.total,
            "used_bytes": snap.capacity.used,
            "free_bytes": snap.capacity.free,
        },
        "tables": [t.to_dict() for t in snap.tables],
        "scan_errors": [{"pid": pid, "reason": reason} for pid, reason in snap.scan_errors],
        "ignored_symlinks": list(snap.symlinks),
    }
