"""Owner watchdog: an engine opsctl started never outlives opsctl by more than ~15 s.

opsctl puts its pid and its start time (clock ticks since boot, /proc/PID/stat field 22)
into the engine's environment (``OPSCTL_OWNER_PID``, ``OPSCTL_OWNER_START``). The plugin
runs in every vLLM process (API server, EngineCore, workers) and starts this daemon
thread in each. The owner counts as gone when its pid no longer exists or now belongs to
another process (different start time), so pid reuse cannot keep an orphan alive.

When the owner is gone:
- the API server sends itself SIGTERM at once: vLLM's own shutdown stops EngineCore and
  workers and its resource tracker unlinks the shared-memory ring buffers;
- every process that is still alive ``KILL_AFTER`` seconds later SIGKILLs itself
  (the API server first the rest of its process group but its resource tracker, which
  exits by itself once the rest is gone and unlinks what was registered with it; then,
  after the removal below, itself), whatever state vLLM's shutdown is in;
- this thread stops for good once its interpreter finalizes (after the exit hooks), so
  the API server's exit hook waits for its ranks to end, kills those still running at
  that deadline, and arms the kernel's alarm for the rest of its exit;
- the API server removes the engine's private ``TMPDIR`` (vLLM's IPC sockets, made by
  opsctl and normally removed by its stop) on its way out: at exit when its owner is
  gone (whichever signal stopped it: the watchdog's or the parent-death signal), or
  after the SIGKILL of the rest of its group; and first the /dev/shm segments vLLM's
  CPU ranks share (``engine_patches.run_segments``: named after the rendezvous file in
  that directory, or one seen there while the owner lived; never unlinked by vLLM),
  once no process holds them. With them go vLLM's ring buffers (``psm_*``) the run's
  processes wrote down as made, and every segment the engine's processes mapped when
  the owner was found gone and again before they were killed (the rendezvous file may
  be gone by then): the processes that made the ring buffers unlink them in vLLM's
  shutdown, unless a deadline killed them first (vLLM's own, 5 s after its SIGTERM, or
  ours). Either way the API server waits for its ranks to let go up to ``KILLED_WAIT``
  after their deadline (at exit at least ``SEGMENTS_WAIT``), one removal at a time, so
  none of these outlives it; a segment still held then is kept, and the server log
  names its holders.

A zombie owner counts as gone: it can no longer clean up.

The test-only knob ``OPSCTL_TEST_NO_OWNER_WATCH`` (honoured only with
``OPSCTL_TEST_KNOBS=1``, see ``engine_patches.knobs``) switches the watchdog off, so a
test can make a real orphan for ``opsctl runs clean``.

Pure standard library: it runs inside vLLM before anything else of ours.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator

from engine_patches import knobs, private_tmp, run_segments

OWNER_PID = "OPSCTL_OWNER_PID"
OWNER_START = "OPSCTL_OWNER_START"
PERIOD = 0.5
KILL_AFTER = 8.0
SEGMENTS_WAIT = 5.0  # at exit: the most the API server waits for its ranks to let go
KILLED_WAIT = 5.0  # after SIGKILL of the rest of its group: for their mappings to go
EXIT_BOUND = 5  # s: after the API server's exit hook, the most the rest of its exit takes

_started_in: int | None = None  # pid of the process whose watchdog runs (fork-safe)
_recorded_in: int | None = None
_gone_at: float | None = None  # monotonic time the API server found its owner gone
_noted: set[str] = set()  # the segments its engine's processes mapped then
_idents: set[str] = set()  # rendezvous idents seen in its private TMPDIR while the owner lived
_removal = threading.Lock()  # one removal at a time: the exit hook's or the watchdog's


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


def _remove_tmp(until: float) -> None:
    """The run's rank segments (named in the private TMPDIR) and the segments noted
    when the owner was found gone, then that directory.

    Waits until the monotonic time ``until`` for ranks still holding a segment to let
    go, and for the other thread's removal to end (past it, removes beside it)."""
    got = _removal.acquire(timeout=max(0.0, until - time.monotonic()))
    try:
        with contextlib.suppress(Exception):
            seen = run_segments.names(sorted(_idents))  # their files may be gone by now
            removed, kept = run_segments.remove(
                private_tmp.own_dir(),
                wait=max(0.0, until - time.monotonic()),
                extra=_noted | {os.path.join(run_segments.SHM, n) for n in seen},
                but=os.getpid(),  # it is on its way out: what it maps goes with it
            )
            if removed or kept:
                print(f"[opsctl] shm segments removed {removed}, kept (held) {kept}", flush=True)
            if kept:  # say who holds them: the line to read when one is left
                held = run_segments.who_holds(
                    {os.path.join(run_segments.SHM, n) for n in kept}, os.getpid()
                )
                print(f"[opsctl] held by {held}", flush=True)
        why = private_tmp.remove_own()
        if why:
            print(f"[opsctl] {why}", flush=True)
    finally:
        if got:
            _removal.release()


def _at_exit(pid: int, ticks: int, me: int) -> None:
    """The API server exits while its owner is gone: nobody else will remove its
    private TMPDIR and its ranks' segments, nor end a rank still running. (While the
    owner lives, its stop does all that and reports on it.)

    The watchdog thread still runs while exit hooks run, but stops for good once the
    interpreter finalizes after them (a daemon thread), and so does each rank's. So the
    hook waits for the ranks to end, and kills those still running when their own
    watchdog would have (vLLM's shutdown can hang past that): an exit that went fast
    leaves no rank behind. And it bounds the rest of this process's exit."""
    if os.getpid() == me and not owner_alive(pid, ticks):
        # a parent-death signal may stop it before the watchdog looked; the ranks end by
        # vLLM's shutdown, by their own watchdog's SIGKILL or by ours
        kill_at = _note_gone() + KILL_AFTER
        try:
            with _deaf():
                _end_the_rest(kill_at)
                _remove_tmp(until=max(time.monotonic() + SEGMENTS_WAIT, kill_at + KILLED_WAIT))
        finally:
            _bound_the_exit(kill_at + KILLED_WAIT)


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != b"Z"


def _helpers() -> set[int]:
    """The resource tracker and forkserver this process started, if any: they exit by
    themselves once every process of the engine is gone (their pipe closes); the tracker
    unlinks then what was registered with it and never unlinked."""
    found = set()
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        found.add(resource_tracker._resource_tracker._pid)  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver

        found.add(forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]
    return {p for p in found if isinstance(p, int)}


def _end_the_rest(kill_at: float) -> list[int]:
    """Wait until the monotonic time ``kill_at`` for the rest of this process group
    (``_the_rest``: its ranks) to end, then SIGKILL what still runs; the pids killed.
    Their mappings are noted first: the removal after it takes those segments."""
    while True:
        left = [p for p in _the_rest() if _running(p)]
        if not left or time.monotonic() >= kill_at:
            break
        time.sleep(0.1)
    if left:
        _note_gone()
        _kill(left)
        print(f"[opsctl] killed the ranks still running after its exit began: {left}", flush=True)
    return left


def _bound_the_exit(deadline: float) -> None:
    """The rest of this process's exit (other exit hooks, the interpreter's finalization,
    C++ destructors) ends at the monotonic time ``deadline``, at the latest
    ``EXIT_BOUND`` seconds from now, and at least 1 s from now: then the kernel ends it
    (SIGALRM, its default action), however stuck it is."""
    left = min(float(EXIT_BOUND), deadline - time.monotonic())
    with contextlib.suppress(ValueError, OSError):  # not the main thread
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(max(1, math.ceil(left)))


@contextlib.contextmanager
def _deaf() -> Iterator[None]:
    """Ignore SIGTERM, SIGINT and SIGHUP for a while (main thread), then listen again.

    The exit hook's removal must not be cut short by the watchdog's own SIGTERM (sent
    when it finds the owner gone after a parent-death signal began the exit): vLLM's
    handler raises KeyboardInterrupt in whatever runs, and the ranks' cpushm segments
    stayed (seen beside the CPU hog). The watchdog's SIGKILL still bounds it."""
    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            old[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)


def _the_rest() -> list[int]:
    """The other processes of this process group (the API server's: its engine) but its
    multiprocessing helpers (``_helpers``): they exit by themselves once the rest is gone,
    the resource tracker after unlinking what was registered with it and never unlinked
    (vLLM's executor lock, a named semaphore, was left in /dev/shm when the tracker died
    by the watchdog's SIGKILL). None unless this process leads its group (opsctl starts
    the API server in a session of its own): never another group's processes."""
    if os.getpgid(0) != os.getpid():
        return []
    spared = _helpers()
    return [pid for pid in _group_but_me() if pid not in spared]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _kill_the_rest_of_my_group() -> None:
    """SIGKILL the rest of this process group (``_the_rest``)."""
    _kill(_the_rest())


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
        _note_gone()  # with what ranks still starting then have mapped since
        _kill_the_rest_of_my_group()  # then their segments are soon held by nobody
        # not the whole group yet: this process removes them first, however long the
        # exit hook's removal (the other thread) still had to wait
        _remove_tmp(until=time.monotonic() + KILLED_WAIT)
        _kill_the_rest_of_my_group()  # and whatever was forked meanwhile
    os.kill(os.getpid(), signal.SIGKILL)


def _watch_owner(pid: int, ticks: int, role: str) -> None:
    """Return once the owner is gone. The API server remembers meanwhile the rendezvous
    idents in its private TMPDIR (a listing every ``PERIOD``): torch's FileStore deletes
    that file in an orderly shutdown of the ranks, which can end before the owner's
    death is seen, and the ranks' cpushm segments are named after it."""
    tmp = private_tmp.own_dir() if role == "api_server" else None
    while owner_alive(pid, ticks):
        if tmp:
            _idents.update(run_segments.idents(tmp))
        time.sleep(PERIOD)


def _run(pid: int, ticks: int, role: str) -> None:
    _watch_owner(pid, ticks, role)
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
