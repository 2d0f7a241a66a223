"""Owner watchdog: an engine opsctl started never outlives opsctl by more than ~15 s.

opsctl puts its pid and its start time (clock ticks since boot, /proc/PID/stat field 22)
into the engine's environment (``OPSCTL_OWNER_PID``, ``OPSCTL_OWNER_START``). The plugin
runs in every vLLM process (API server, EngineCore, workers) and starts this daemon
thread in each. The owner counts as gone when its pid no longer exists or now belongs to
another process (different start time), so pid reuse cannot keep an orphan alive.

When the owner is gone:
- the API server sends itself SIGTERM at once: vLLM's own shutdown stops EngineCore and
  workers and its resource tracker unlinks the shared-memory ring buffers;
- every process that is still alive ``KILL_AFTER`` seconds later SIGKILLs itself (and
  the API server its whole process group), whatever state vLLM's shutdown is in;
- the API server removes the engine's private ``TMPDIR`` (vLLM's IPC sockets, made by
  opsctl and normally removed by its stop) on its way out: at exit when its owner is
  gone (whichever signal stopped it: the watchdog's or the parent-death signal), or
  before the SIGKILL of its process group; and first the /dev/shm segments vLLM's CPU
  ranks share (``engine_patches.run_segments``: named after the rendezvous file in that
  directory, never unlinked by vLLM), once no process holds them (its ranks get
  ``SEGMENTS_WAIT`` seconds to let go; before the process group's SIGKILL the rest of
  the group is killed first). With them go vLLM's ring buffers (``psm_*``) and the
  ranks' cpushm segments that the engine's processes mapped when the owner was found
  gone (the rendezvous file may be gone by then): the processes that made the ring
  buffers unlink them in vLLM's shutdown, unless their own deadline killed them first. At exit
  the API server waits for its ranks up to their deadline (``KILL_AFTER`` after the owner
  was found gone, then ``KILLED_WAIT``), so none of these outlives it.

A zombie owner counts as gone: it can no longer clean up.

The test-only knob ``OPSCTL_TEST_NO_OWNER_WATCH`` (honoured only with
``OPSCTL_TEST_KNOBS=1``, see ``engine_patches.knobs``) switches the watchdog off, so a
test can make a real orphan for ``opsctl runs clean``.

Pure standard library: it runs inside vLLM before anything else of ours.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time

from engine_patches import knobs, private_tmp, run_segments

OWNER_PID = "OPSCTL_OWNER_PID"
OWNER_START = "OPSCTL_OWNER_START"
PERIOD = 0.5
KILL_AFTER = 8.0
SEGMENTS_WAIT = 5.0  # at exit: the most the API server waits for its ranks to let go
KILLED_WAIT = 2.0  # after SIGKILL of its group: for the kernel to reap the mappings

_started_in: int | None = None  # pid of the process whose watchdog runs (fork-safe)
_recorded_in: int | None = None
_gone_at: float | None = None  # monotonic time the API server found its owner gone
_noted: set[str] = set()  # the segments its engine's processes mapped then


def recorded() -> bool:
    """True the second time it is asked in one process (record the start once)."""
    global _recorded_in
    done, _recorded_in = _recorded_in == os.getpid(), os.getpid()
    return done


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (state) on, None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """/proc/PID/stat field 22 (start time in clock ticks), None if the pid is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def owner_alive(pid: int, ticks: int) -> bool:
    """Whether process ``pid`` still is the owner that started at ``ticks`` (not a zombie)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z" and int(fields[19]) == ticks


def _group_but_me() -> list[int]:
    """The other processes of this process group (the API server's: its engine)."""
    me, group, found = os.getpid(), os.getpgid(0), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == group:
                    found.append(int(entry))
    return found


def _note_gone() -> float:
    """The owner is gone (API server): note the segments its engine maps now; the
    monotonic time it was first found gone."""
    global _gone_at
    if _gone_at is None:
        _gone_at = time.monotonic()
    with contextlib.suppress(Exception):
        _noted.update(run_segments.mapped_segments(_group_but_me()))
    return _gone_at


def _remove_tmp(wait: float = 0.0) -> None:
    """The run's rank segments (named in the private TMPDIR) and the segments noted
    when the owner was found gone, then that directory.

    Waits up to ``wait`` seconds for ranks still holding a segment to let go."""
    with contextlib.suppress(Exception):
        removed, kept = run_segments.remove(private_tmp.own_dir(), wait=wait, extra=_noted)
        if removed or kept:
            print(f"[opsctl] shm segments removed {removed}, kept (held) {kept}", flush=True)
    why = private_tmp.remove_own()
    if why:
        print(f"[opsctl] {why}", flush=True)


def _at_exit(pid: int, ticks: int, me: int) -> None:
    """The API server exits while its owner is gone: nobody else will remove its
    private TMPDIR and its ranks' segments. (While the owner lives, its stop removes
    them and reports on them.)"""
    if os.getpid() == me and not owner_alive(pid, ticks):
        # a parent-death signal may stop it before the watchdog looked; the ranks end by
        # vLLM's shutdown or by their own watchdog's SIGKILL
        deadline = _note_gone() + KILL_AFTER + KILLED_WAIT
        _remove_tmp(wait=max(SEGMENTS_WAIT, deadline - time.monotonic()))


def _kill_the_rest_of_my_group() -> None:
    """SIGKILL every other process of this process group (the API server's: its engine)."""
    for pid in _group_but_me():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def watching(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """The owner to watch: (pid, start ticks), or None.

    None: not started by opsctl, the knob off, or malformed values."""
    env = dict(os.environ) if env is None else env
    if knobs.get(knobs.NO_OWNER_WATCH, env):
        return None
    try:
        return int(env[OWNER_PID]), int(env[OWNER_START])
    except (KeyError, ValueError):
        return None


def _on_owner_gone(role: str) -> None:
    if role == "api_server":
        _note_gone()
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(KILL_AFTER)  # vLLM's orderly shutdown had its chance
    if role == "api_server":
        _kill_the_rest_of_my_group()  # then their segments are held by nobody
        _remove_tmp(wait=KILLED_WAIT)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _run(pid: int, ticks: int, role: str) -> None:
    while owner_alive(pid, ticks):
        time.sleep(PERIOD)
    print(
        f"[opsctl] owner process {pid} is gone: stopping this {role} process",
        flush=True,
    )
    _on_owner_gone(role)


def start(role: str) -> bool:
    """Start the watchdog thread in this process (once per process); True if it runs."""
    global _started_in
    if _started_in == os.getpid():
        return True
    owner = watching()
    if owner is None:
        return False
    _started_in = os.getpid()
    if role == "api_server":
        atexit.register(_at_exit, *owner, os.getpid())
    threading.Thread(
        target=_run, args=(*owner, role), name="opsctl-owner-watch", daemon=True
    ).start()
    return True
