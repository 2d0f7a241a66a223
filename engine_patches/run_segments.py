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

Exactly which ring buffers a run made is written down as they are made: in every
process of the engine, :func:`record_made` wraps ``multiprocessing.shared_memory``'s
constructor, and each segment it creates leaves an empty file of its name in
``<private TMPDIR>/.opsctl-shm`` (:func:`made`). That is what finds a ring buffer made
after the owner died and before vLLM's own deadline killed its maker: seen beside a busy
test tier, an EngineCore of ``serve --dp 2`` still starting made two after the API server
had last looked at what its engine mapped.

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
MADE = ".opsctl-shm"  # in the run's private TMPDIR: one empty file per segment it made


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


def made(tmp_dir: str | os.PathLike[str] | None, root: str = SHM) -> list[str]:
    """The segments in ``root`` that the run of this private TMPDIR wrote down as made.

    Written down by :func:`record_made`; those gone from ``root`` are left out."""
    if not tmp_dir:
        return []
    try:
        recorded = os.listdir(os.path.join(tmp_dir, MADE))
    except OSError:
        return []
    return sorted(n for n in recorded if os.path.lexists(os.path.join(root, n)))


def run_names(tmp_dir: str | os.PathLike[str] | None, root: str = SHM) -> list[str]:
    """Every segment in ``root`` of the run whose private TMPDIR is ``tmp_dir``.

    Its ranks' (named after its rendezvous) and those it wrote down as made."""
    return sorted(set(names(idents(tmp_dir), root)) | set(made(tmp_dir, root)))


def note_made(name: str, tmp_dir: str | None) -> None:
    """Write down that this run made the segment ``name`` (never fails)."""
    if not tmp_dir or not name or "/" in name or name in (".", ".."):
        return
    with contextlib.suppress(OSError):
        folder = os.path.join(tmp_dir, MADE)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "a"):
            pass


def record_made() -> bool:
    """In an engine process: write down each shared-memory segment it makes from now on.

    Wraps ``multiprocessing.shared_memory.SharedMemory``; the record goes into the
    private TMPDIR of the process's run, read when the segment is made (a forked child
    keeps the wrapper). True once it is in place."""
    from multiprocessing import shared_memory

    from engine_patches import private_tmp

    cls = shared_memory.SharedMemory
    if getattr(cls.__init__, "opsctl_records", False):
        return True
    original = cls.__init__

    def __init__(self, name=None, create=False, size=0, **kwargs):
        original(self, name, create, size, **kwargs)
        if create:
            note_made(self.name, private_tmp.own_dir())

    __init__.opsctl_records = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]
    return True


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


def _holding(paths: set[str], but: int | None) -> dict[str, set[str]]:
    """Each live process (other than ``but``) -> those of ``paths`` it maps or holds open."""
    found = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != but):
        held = _mapped_or_open(pid) & paths
        if held:
            found[pid] = held
    return found


def holders(paths: set[str], but: int | None = None) -> set[str]:
    """Those of ``paths`` some live process (other than ``but``) maps or holds open."""
    return {path for held in _holding(paths, but).values() for path in held}


def who_holds(paths: set[str], but: int | None = None) -> dict[str, list[str]]:
    """Map each held path of ``paths`` to its holders, as ``"PID (name)"``.

    Holders: live processes (other than ``but``) that map it or hold it open. What the
    API server prints when it has to keep a segment."""
    found: dict[str, list[str]] = {}
    for pid, held in _holding(paths, but).items():
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
                name = fh.read().strip()
        except OSError:
            name = "?"
        for path in held:
            found.setdefault(path, []).append(f"{pid} ({name})")
    return found


def remove(
    tmp_dir: str | os.PathLike[str] | None,
    root: str = SHM,
    wait: float = 0.0,
    extra: Iterable[str] = (),
    but: int | None = None,
) -> tuple[list[str], list[str]]:
    """Remove the run's segments and the paths ``extra`` that nothing holds.

    Returns (removed, kept). Waits up to ``wait`` seconds for the processes still
    holding one to let go (ranks being stopped). What process ``but`` holds counts as
    free (the API server removing them on its way out)."""
    paths = {os.path.join(root, n) for n in run_names(tmp_dir, root)} | set(extra)
    deadline = time.monotonic() + wait
    held = holders(paths, but)
    while held and time.monotonic() < deadline:
        time.sleep(0.1)
        held = holders(paths, but)
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
