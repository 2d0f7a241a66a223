"""Exit watcher: this process's multiprocessing children, and how and when each ended.

opsctl can wait() only on the API server it started; the exit codes of vLLM's other
processes (an EngineCore, a Worker, the DP coordinator) are known only to their parents.
In every vLLM process the plugin starts this daemon thread: it keeps every child it has
seen (``multiprocessing.active_children()``), waits on their sentinels
(``multiprocessing.connection.wait``: woken the moment one ends) and appends one JSON line
to ``<run>/exits.jsonl`` per child that ended::

    {"pid": 2425, "name": "VllmWorker-1", "exitcode": -9, "time": 1765000000.1,
     "parent": 2400, "parent_title": "VLLM::EngineCore"}

``exitcode`` is multiprocessing's: negative for a signal (-9: SIGKILL). The line is
written with one ``write`` to a file opened with O_APPEND, so lines of several processes
never interleave. opsctl (``opsctl.domain.deaths``) turns these lines into the rank that
died first.

Public multiprocessing API only; pure standard library; never raises into vLLM (a
failure ends the watch quietly). Inert without ``OPSCTL_RUN_DIR``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import threading
import time

FILE = "exits.jsonl"
# seconds between looks for new children (a death wakes the wait at once): a child that
# ends before the watcher first saw it is not recorded (active_children() forgets it)
PERIOD = 0.2

_started_in: int | None = None  # pid of the process whose watcher runs (fork-safe)
_KNOWN: dict[int, multiprocessing.process.BaseProcess] = {}  # children seen, not yet ended
_LOCK = threading.Lock()  # the watcher thread and the exit-time round


def record_exit(run_dir: str, payload: dict) -> None:
    """Append one exit line to ``<run_dir>/exits.jsonl`` (one write, O_APPEND)."""
    line = (json.dumps(payload, default=str) + "\n").encode()
    fd = os.open(os.path.join(run_dir, FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _title() -> str:
    with contextlib.suppress(Exception):
        import setproctitle  # type: ignore[import-not-found]

        return str(setproctitle.getproctitle())
    return ""


def _ended(proc: multiprocessing.process.BaseProcess) -> int | bool | None:
    """The child's exit code; False while it runs; None when it cannot be told (closed).

    A child's sentinel is ready as soon as the kernel closed its files, a moment before
    it can be waited for: a ready sentinel is joined (a second at most) for its code."""
    try:
        code = proc.exitcode
        if code is None and multiprocessing.connection.wait([proc.sentinel], 0):
            proc.join(1.0)
            code = proc.exitcode
    except (ValueError, AssertionError, OSError):  # closed, or not ours to join
        return None
    return False if code is None else code


def watch_once(
    known: dict[int, multiprocessing.process.BaseProcess], run_dir: str, timeout: float
) -> None:
    """One round: add new children, wait up to ``timeout`` for one to end, record the ended."""
    for child in multiprocessing.active_children():
        if child.pid is not None:
            known.setdefault(child.pid, child)
    sentinels = []
    for proc in list(known.values()):
        with contextlib.suppress(ValueError):
            sentinels.append(proc.sentinel)
    if sentinels:
        with contextlib.suppress(OSError, ValueError):
            multiprocessing.connection.wait(sentinels, timeout)
    else:
        time.sleep(timeout)
    record_ended(known, run_dir)


def record_ended(known: dict[int, multiprocessing.process.BaseProcess], run_dir: str) -> None:
    """Record (and forget) every child of ``known`` that has ended."""
    now = time.time()
    with _LOCK:
        for pid, proc in list(known.items()):
            code = _ended(proc)
            if code is False:
                continue
            del known[pid]
            if code is None:
                continue
            payload = {
                "pid": pid,
                "name": proc.name,
                "exitcode": code,
                "time": round(now, 3),
                "parent": os.getpid(),
                "parent_title": _title(),
            }
            with contextlib.suppress(OSError):
                record_exit(run_dir, payload)


def _run(run_dir: str) -> None:
    while os.path.isdir(run_dir):  # a run directory removed ends the watch
        try:
            watch_once(_KNOWN, run_dir, PERIOD)
        except Exception:  # never into vLLM; a broken round is retried later
            time.sleep(PERIOD)


def _at_exit(run_dir: str, me: int) -> None:
    """This process exits (vLLM turns SIGTERM into an orderly exit): record the children
    that ended since the thread's last round (it may not get another)."""
    if os.getpid() == me:
        with contextlib.suppress(Exception):
            record_ended(_KNOWN, run_dir)


def start(run_dir: str | None = None) -> bool:
    """Start the watcher thread in this process (once per process); True if it runs."""
    global _started_in
    base = run_dir or os.environ.get("OPSCTL_RUN_DIR")
    if not base:
        return False
    if _started_in == os.getpid():
        return True
    _started_in = os.getpid()
    _KNOWN.clear()  # a forked child's parent's children are not its own
    atexit.register(_at_exit, base, os.getpid())
    threading.Thread(target=_run, args=(base,), name="opsctl-exits", daemon=True).start()
    return True
