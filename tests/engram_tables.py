"""Real Engram-style shared tables for tests, built exactly as vLLM 0.32 builds them
(``DPSharedEngramStorage._allocate``): a file ``/dev/shm/vllm_engram_<unique>``,
ftruncate to ``rows*dim + rows*dim/B`` with B = 32 (``ParallelEngramEmbedding``
``block_size=32``; ``block=128`` builds the 128-element-block layout), mmap MAP_SHARED
of exactly that many bytes, constant fill (weights 0x38 =
fp8 e4m3 1.0, scales 127 = ue8m0 1.0), N real processes that map it and touch every
page, then the creator unlinks it so the table lives on only as "(deleted)" mappings.

Everything is torn down in ``close()`` (children stopped, file removed); use
:func:`shared_table` as a context manager so a failing test still cleans up.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

SHM = "/dev/shm"
PREFIX = "vllm_engram_"

CHILD = r"""
import mmap, os, sys
import numpy as np
fd = os.open(sys.argv[1], os.O_RDWR)
size = os.fstat(fd).st_size
mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
os.close(fd)
a = np.frombuffer(mm, dtype=np.uint8)
touched = int(a[::mmap.PAGESIZE].astype(np.int64).sum()) + int(a[-1])  # fault in every page
print("ready", os.getpid(), touched, flush=True)
sys.stdin.readline()
"""


def unique_prefix(tag: str = "t") -> str:
    """A per-test prefix, so tests never see (or clean) anyone else's tables."""
    return f"{PREFIX}{tag}{uuid.uuid4().hex[:10]}_"


VLLM_BLOCK = 32  # vLLM 0.32 ParallelEngramEmbedding(block_size=32)


@contextlib.contextmanager
def shm_file(name: str, data: bytes) -> Iterator[str]:
    """The file /dev/shm/``name`` holding ``data``; removed on exit if still there."""
    path = f"/dev/shm/{name}"
    try:
        with open(path, "wb") as fh:
            fh.write(data)
        yield path
    finally:
        if os.path.exists(path):
            os.unlink(path)


def deny_fds(monkeypatch, pid: int) -> None:
    """Make ``pid``'s /proc/PID/fd unreadable to opsctl's shm scan (CI runs as root)."""
    from opsctl.collectors import shm

    real = shm.read_fds

    def read_fds(p, *a, **kw):
        if p == pid:
            raise PermissionError(13, "Permission denied")
        return real(p, *a, **kw)

    monkeypatch.setattr(shm, "read_fds", read_fds)


def fill(path: str, rows: int, dim: int, block: int = VLLM_BLOCK) -> int:
    weight = rows * dim
    total = weight + weight // block
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, total)
        mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    arr = np.frombuffer(mm, dtype=np.uint8)
    arr[:weight] = 0x38
    arr[weight:] = 127
    del arr
    mm.close()
    return total


def write_byte(path: str, offset: int, value: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([value]), offset)
    finally:
        os.close(fd)


@dataclass
class Table:
    path: str
    total: int
    weight_bytes: int
    block: int = VLLM_BLOCK
    children: list[subprocess.Popen] = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children if c.poll() is None]

    def spawn(self, n: int) -> None:
        for _ in range(n):
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, self.path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.children.append(child)
        for child in self.children[-n:]:
            line = child.stdout.readline() if child.stdout else ""
            assert line.startswith("ready"), f"mapper did not start: {line!r}"

    def unlink(self) -> None:
        os.unlink(self.path)

    def stop(self, child: subprocess.Popen) -> None:
        with contextlib.suppress(Exception):
            child.kill()
        child.wait(10)

    def close(self) -> None:
        for child in self.children:
            self.stop(child)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# Tables of these tests live in the real /dev/shm under vLLM's prefix, some deliberately
# not constant-filled. A test whose verdict depends on every table on the host (certify's
# engram check scans them all) takes this lock exclusively; every shared_table holds it
# shared for its lifetime, so on other xdist workers none is being built or planted then.
HOST_LOCK = os.path.join(tempfile.gettempdir(), "opsctl-tests-engram-tables.lock")


@contextlib.contextmanager
def _host_lock(kind: int) -> Iterator[None]:
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, kind)
        yield
    finally:
        os.close(fd)


def no_test_tables() -> contextlib.AbstractContextManager[None]:
    """While held, no other test process has a table of this module on the host."""
    return _host_lock(fcntl.LOCK_EX)


def planting() -> contextlib.AbstractContextManager[None]:
    """Held (shared) by a test that writes tables into /dev/shm itself, not through
    :func:`shared_table`, for as long as they may be there: certify's engram check on
    another xdist worker (no_test_tables) waits for it. Two fresh clones failed a
    certify test on test_engram_cli's directly planted table without it."""
    return _host_lock(fcntl.LOCK_SH)


@contextlib.contextmanager
def shared_table(
    prefix: str,
    *,
    rows: int = 4096,
    dim: int = 256,
    mappers: int = 3,
    unlink: bool = True,
    block: int = VLLM_BLOCK,
    suffix: str = "a",
) -> Iterator[Table]:
    path = f"{SHM}/{prefix}{suffix}"
    table = Table(path, 0, rows * dim, block=block)
    with _host_lock(fcntl.LOCK_SH):
        try:
            table.total = fill(path, rows, dim, block)
            table.spawn(mappers)
            if unlink:
                table.unlink()  # the creator (rank 0) unlinks once every rank has mapped it
            yield table
        finally:
            table.close()
