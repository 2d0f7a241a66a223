"""I/O of ``opsctl runs bundle``: read a run's files and answers, write the tar.gz.

The end of the big files; /metrics and /server_info of its server; the API server's environment
(only the process meta.json recorded, same start time).

Nothing here decides what is secret (opsctl.domain.redact) or what goes in the bundle
(opsctl.checks.bundle); a file or answer that cannot be had is a ``why``, never a raise.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from opsctl.collectors.http import client

MAX_FILE = 16 * 1024 * 1024  # bytes kept of one file (its end: logs grow long)


@dataclass(frozen=True, slots=True)
class FileRead:
    """One file of the run directory as read for the bundle (perhaps only its end)."""

    rel: str  # path inside the run directory
    data: bytes
    size: int  # on disk
    truncated: bool  # only the last MAX_FILE bytes were kept


def run_files(run_dir: Path, limit: int = MAX_FILE) -> tuple[list[FileRead], list[str]]:
    """The run directory's regular files, each cut to its last ``limit`` bytes.

    Symlinks are not followed; also returns why some files could not be read."""
    out: list[FileRead] = []
    errors: list[str] = []
    for root, dirs, files in os.walk(run_dir, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            rel = str(path.relative_to(run_dir))
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                size = path.stat().st_size
                with path.open("rb") as fh:
                    if size > limit:
                        fh.seek(size - limit)
                    data = fh.read(limit)
            except OSError as exc:
                errors.append(f"{rel}: {exc.strerror or exc}")
                continue
            out.append(FileRead(rel, data, size, size > limit))
    return out, errors


@dataclass(frozen=True, slots=True)
class Fetched:
    """What the server answered to one GET for the bundle, or why there was no answer."""

    path: str
    status: int | None  # None: no HTTP answer
    text: str | None  # the body when 200
    why: str | None = None  # connect error, or the status when not 200


def fetch(url: str, path: str, api_key: str | None, timeout: float) -> Fetched:
    """GET ``path`` from the server at ``url``; the body when 200, else why not."""
    try:
        with client(api_key, timeout=timeout) as c:
            r = c.get(f"{url.rstrip('/')}{path}")
    except httpx.HTTPError as exc:
        return Fetched(path, None, None, f"no answer ({type(exc).__name__})")
    if r.status_code != 200:
        return Fetched(path, r.status_code, None, f"HTTP {r.status_code}")
    return Fetched(path, 200, r.text)


def process_env(pid: int | None, started: float | None) -> tuple[dict[str, str] | None, str]:
    """The environment of ``pid`` when it is still the recorded process; else None and why.

    The recorded process is the one that started at ``started``; another process that reused the
    pid is never read."""
    from opsctl.domain.runs import same_process

    if not pid:
        return None, "no API server pid recorded"
    try:
        p = psutil.Process(pid)
        if started is not None and not same_process(started, p.create_time()):
            return None, f"pid {pid} now belongs to another process"
        return dict(p.environ()), f"/proc/{pid}/environ"
    except psutil.NoSuchProcess:
        return None, f"process {pid} has exited (its environment went with it)"
    except (psutil.AccessDenied, OSError) as exc:
        return None, f"cannot read /proc/{pid}/environ: {exc}"


def write_tar(out: Path, top: str, members: list[tuple[str, bytes]]) -> int:
    """Write ``members`` as a gzipped tar, atomically; returns its size.

    ``members`` are (name inside ``top``/, bytes) pairs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    now = time.time()
    with tarfile.open(tmp, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mtime = int(now)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    os.chmod(tmp, 0o600)
    os.replace(tmp, out)
    return out.stat().st_size
