"""The /dev/shm segments vLLM's CPU ranks share, named after one engine's rendezvous.

On CPU, vLLM's tensor- and pipeline-parallel groups talk through shared memory: every
rank makes ``/dev/shm/<ident>-<group>-[<ranks>]-cpushm_<rank>``
(``vllm/distributed/device_communicators/cpu_communicator.py``), where ``<ident>`` is the
name of the run's torch.distributed rendezvous file, ``$TMPDIR/vllm_dist_<uuid4 hex>``
(``VLLM_DIST_IDENT``, set by ``vllm/v1/worker/cpu_worker.py``). vLLM never unlinks them
(measured on 0.32: left after SIGKILL of opsctl serve --tp 2, whose engine then shut down
on its own). The rendezvous file stays in the engine's private ``TMPDIR`` for the whole
run, so that directory names the run's segments: opsctl's stop and the API server of an
engine whose owner died remove them with :func:`remove`.

The same removal takes vLLM's message-queue ring buffers (``shm_broadcast``'s
``psm_*`` segments between an EngineCore and its workers) that the API server found its
engine's processes mapping (:func:`mapped_segments`, which notes the ranks' cpushm
segments too) when its owner died. Their creator unlinks them in vLLM's orderly
shutdown; when the engine's processes kill themselves before it ends (the owner
watchdog's deadline, on a loaded host) nobody else would: seen after SIGKILL of opsctl
serve --tp 2 beside a busy test tier.

A segment is removed only when no live process maps it or holds it open (read from
/proc, like ``opsctl.collectors.shm``'s rule). Pure standard library: it runs inside vLLM.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable

SHM = "/dev/shm"
IDENT_PREFIX = "vllm_dist_"
MARK = "-cpushm"
RING_PREFIX = "psm_"  # multiprocessing.shared_memory's names: vLLM's ring buffers


def idents(tmp_dir: str | os.PathLike[str] | None) -> list[str]:
    """The rendezvous idents of the run whose private temporary directory is ``tmp_dir``."""
    if not tmp_dir:
        return []
    try:
        names = os.listdir(tmp_dir)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(IDENT_PREFIX) and len(n) > len(IDENT_PREFIX))


def names(run_idents: list[str], root: str = SHM) -> list[str]:
    """The segments in ``root`` vLLM's ranks made for these idents."""
    if not run_idents:
        return []
    try:
        present = os.listdir(root)
    except OSError:
        return []
    return sorted(
        n for n in present if MARK in n and any(n.startswith(f"{i}-") for i in run_idents)
    )


def _mapped_or_open(pid: int | str) -> set[str]:
    """The files process ``pid`` maps or holds open (empty when it is gone)."""
    found: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").removesuffix(" (deleted)").partition(" /")[2]
                if path:
                    found.add("/" + path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def mapped_segments(pids: list[int], root: str = SHM) -> set[str]:
    """The run's segments that the processes ``pids`` map or hold open.

    In ``root``: the ``psm_*`` ring buffers and the ``vllm_dist_*-cpushm_*`` segments.
    Read while the ranks live: the rendezvous file that :func:`idents` reads may be gone
    by the time the segments can be removed (torch's FileStore deletes it when its last
    user closes it: seen beside a CPU hog, the TP ranks' shutdown removed it before the
    API server looked, and both cpushm segments stayed)."""
    rings, dist = os.path.join(root, RING_PREFIX), os.path.join(root, IDENT_PREFIX)
    return {
        path
        for pid in pids
        for path in _mapped_or_open(pid)
        if path.startswith(rings) or (path.startswith(dist) and MARK in path)
    }


def holders(paths: set[str]) -> set[str]:
    """Those of ``paths`` some live process maps or holds open."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    return {path for pid in pids for path in _mapped_or_open(pid) & paths}


def remove(
    tmp_dir: str | os.PathLike[str] | None,
    root: str = SHM,
    wait: float = 0.0,
    extra: Iterable[str] = (),
) -> tuple[list[str], list[str]]:
    """Remove the run's segments and the paths ``extra`` that nothing holds.

    Returns (removed, kept). Waits up to ``wait`` seconds for the processes still holding one to let go (ranks
    being stopped)."""
    found = names(idents(tmp_dir), root)
    paths = {os.path.join(root, n) for n in found} | set(extra)
    deadline = time.monotonic() + wait
    held = holders(paths)
    while held and time.monotonic() < deadline:
        time.sleep(0.1)
        held = holders(paths)
    removed, kept = [], []
    for path in sorted(paths):
        try:
            regular = stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            continue
        if path in held or not regular:
            kept.append(os.path.basename(path))
            continue
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(os.path.basename(path))
    return removed, kept
