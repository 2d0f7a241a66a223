"""The engine's private $TMPDIR: made for one run, removed only when it is that one."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.collectors import engine_tmp


@pytest.fixture
def tmpdir_env(short_tmp, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    # torch's compile cache, which create() makes when missing: not in the TMPDIR watched
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    yield short_tmp
    tempfile.tempdir = None


def test_made_in_tmpdir_and_removed_with_what_vllm_left_in_it(tmp_path, tmpdir_env):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    d = engine_tmp.create(run)
    assert d.parent == tmpdir_env and d.name.startswith(engine_tmp.PREFIX)
    env = engine_tmp.engine_env(d)
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(d)
    # torch's compile cache stays where it was (outside the per-engine directory)
    assert not env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(d))
    with socket.socket(socket.AF_UNIX) as s:  # what vLLM leaves: an IPC socket file
        s.bind(str(d / "0b1e8c3e-ipc"))
    (d / "vllm_dist_x").write_text("")
    assert engine_tmp.remove(d, run) is None
    assert list(tmpdir_env.iterdir()) == []
    assert engine_tmp.remove(d, run) is None  # already gone: fine


def test_torch_finds_its_shared_precompiled_headers_through_the_private_tmpdir(
    tmp_path, tmpdir_env, monkeypatch
):
    """torch puts inductor's precompiled headers under $TMPDIR/torchinductor_<user>
    whatever TORCHINDUCTOR_CACHE_DIR says: in the engine's private $TMPDIR that name leads
    to the shared cache (else each engine rebuilt them), and removing the directory
    leaves the cache and its headers alone."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    shared = tmp_path / "inductor"
    run = tmp_path / "r1"
    d = engine_tmp.create(run)
    env = engine_tmp.engine_env(d)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(shared)
    monkeypatch.setenv("TMPDIR", env["TMPDIR"])
    monkeypatch.setattr(tempfile, "tempdir", None)  # as the engine reads it
    headers = Path(default_cache_dir()) / "precompiled_headers"  # torch's _HEADER_DIR
    headers.mkdir()
    (headers / "h.gch").write_text("x")
    assert (shared / "precompiled_headers" / "h.gch").read_text() == "x"
    assert engine_tmp.remove(d, run) is None and not d.exists()
    assert (shared / "precompiled_headers" / "h.gch").read_text() == "x"


def test_never_removes_what_it_did_not_make_for_this_run(tmp_path, tmpdir_env):
    run, other = tmp_path / "r1", tmp_path / "r2"
    mine = engine_tmp.create(run)
    assert "another run" in engine_tmp.remove(mine, other)
    assert mine.is_dir()

    foreign = tmpdir_env / f"{engine_tmp.PREFIX}user"  # our prefix, no marker
    foreign.mkdir()
    assert "no opsctl marker" in engine_tmp.remove(foreign, run)
    assert foreign.is_dir()

    plain = tmpdir_env / "data"
    plain.mkdir()
    (plain / engine_tmp.MARKER).write_text(str(run.resolve()))
    assert "not an opsctl engine" in engine_tmp.remove(plain, run)
    assert plain.is_dir()

    link = tmpdir_env / f"{engine_tmp.PREFIX}link"
    os.symlink(mine, link)
    assert "not an opsctl engine" in engine_tmp.remove(link, run)
    assert mine.is_dir() and link.is_symlink()
    assert engine_tmp.remove(None, run) is None


def test_a_tmpdir_too_long_for_vllm_sockets_falls_back_to_slash_tmp(tmp_path, monkeypatch):
    long = tmp_path / ("x" * (engine_tmp.SUN_PATH_MAX - len(str(tmp_path))))
    long.mkdir()
    assert not engine_tmp.fits(str(long)) and engine_tmp.fits("/tmp")
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        run = tmp_path / "r1"
        d = engine_tmp.create(run)
        assert d is not None and d.parent == Path("/tmp"), d
        path = str(d / ("u" * engine_tmp.VLLM_SOCKET_NAME))
        with socket.socket(socket.AF_UNIX) as s:  # vLLM's longest socket path binds
            s.bind(path)
        assert engine_tmp.remove(d, run) is None and not d.exists()
    finally:
        tempfile.tempdir = None


def test_the_engine_removes_its_own_private_tmpdir_only_when_its_owner_is_gone(
    tmp_path, tmpdir_env, monkeypatch
):
    """After SIGKILL of opsctl, nobody but the engine's API server is left to remove the
    directory: its exit hook does, once the owner is gone (a zombie counts as gone),
    and never while the owner lives (its stop removes it and reports on it)."""
    import subprocess
    import sys

    from engine_patches import watchdog
    from tests.waiting import wait_until

    run = tmp_path / "r1"
    d = engine_tmp.create(run)
    env = {"OPSCTL_RUN_DIR": str(run), "TMPDIR": str(d)}
    os.environ.update(env)  # monkeypatch (tmpdir_env) restores TMPDIR
    monkeypatch.setattr(watchdog, "_gone_at", None)
    monkeypatch.setattr(watchdog, "_noted", set())
    # here the "API server" is pytest: its group's other processes are not ranks, and no
    # alarm may end it (tests/unit/test_engine_tmp.py's LAST_WORDS judges both for real)
    ends: list[str] = []
    monkeypatch.setattr(watchdog, "_end_the_rest", lambda kill_at: ends.append("rest"))
    monkeypatch.setattr(watchdog, "_bound_the_exit", lambda deadline: ends.append("bound"))
    try:
        me = os.getpid()
        watchdog._at_exit(me, watchdog.start_ticks(me), me)  # owner alive: kept
        assert d.is_dir() and ends == []
        owner = subprocess.Popen([sys.executable, "-c", "pass"])
        ticks = wait_until(lambda: watchdog.start_ticks(owner.pid), 10, "the owner's stat")
        wait_until(lambda: not watchdog.owner_alive(owner.pid, ticks), 30, "a zombie owner")
        assert watchdog.start_ticks(owner.pid) == ticks  # not reaped yet: a zombie
        watchdog._at_exit(owner.pid, ticks, me + 1)  # another process's hook (a fork)
        assert d.is_dir()
        assert ends == []
        watchdog._at_exit(owner.pid, ticks, me)
        assert not d.exists() and list(tmpdir_env.iterdir()) == []
        assert ends == ["rest", "bound"]
        owner.wait(10)
    finally:
        os.environ.pop("OPSCTL_RUN_DIR", None)


RING_MAKER = """
import sys
from multiprocessing import resource_tracker, shared_memory
rings = [shared_memory.SharedMemory(name=n, create=True, size=4096) for n in sys.argv[1:]]
for ring in rings:  # as in an engine whose resource tracker died with it: no unlink
    resource_tracker.unregister(ring._name, "shared_memory")
print("made", flush=True)
sys.stdin.read()
"""


HOLDER = """
import sys
held = open(sys.argv[1], "rb")
print("held", flush=True)
sys.stdin.read()
"""


def test_the_api_server_removes_the_ring_buffers_its_dead_ranks_mapped(monkeypatch, capsys):
    """SIGKILL of opsctl, then the ranks kill themselves before vLLM's shutdown unlinks
    their ring buffers (seen: two psm_ segments left by a TP=2 engine on a loaded host).
    The API server notes the psm_ and cpushm segments its process group maps when it
    finds the owner gone; its exit removes them once nothing holds them, and keeps one
    still held, and names its holder in the server log."""
    import signal
    import subprocess
    import sys

    from engine_patches import watchdog

    monkeypatch.setattr(watchdog, "_gone_at", None)
    monkeypatch.setattr(watchdog, "_noted", set())
    monkeypatch.delenv("OPSCTL_RUN_DIR", raising=False)  # no private TMPDIR to remove
    tag = os.urandom(4).hex()
    dead, held = f"psm_opsctl_test_{tag}_a", f"psm_opsctl_test_{tag}_b"
    # a TP rank's cpushm segment whose rendezvous file is already gone (no private
    # TMPDIR names it): found by its mapping alone
    cpushm = f"vllm_dist_opsctltest{tag}-tp:0-[0-1]-cpushm_1"
    paths = [f"/dev/shm/{dead}", f"/dev/shm/{held}", f"/dev/shm/{cpushm}"]
    rank = subprocess.Popen(  # a rank: in this process group, as in the engine's
        [sys.executable, "-c", RING_MAKER, dead, held, cpushm], stdin=subprocess.PIPE, text=True,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    holder = rank
    try:
        assert rank.stdout.readline() == "made\n"
        watchdog._note_gone()
        assert set(paths) <= watchdog._noted
        holder = subprocess.Popen(  # another process still holds this one
            [sys.executable, "-c", HOLDER, paths[1]], stdin=subprocess.PIPE, text=True,
            stdout=subprocess.PIPE,
        )  # fmt: skip
        with open(paths[0], "rb"):  # the API server's own: goes with it, so counts as free
            assert holder.stdout.readline() == "held\n"
            rank.send_signal(signal.SIGKILL)
            rank.wait(30)
            assert all(os.path.exists(p) for p in paths)  # nobody unlinked them
            watchdog._remove_tmp(until=time.monotonic() + 0.5)
        assert not os.path.exists(paths[0]) and os.path.exists(paths[1])
        assert not os.path.exists(paths[2])
        said = capsys.readouterr().out
        assert f"kept (held) ['{held}']" in said
        assert f"[opsctl] held by {{'{paths[1]}': ['{holder.pid} (python" in said
        holder.stdin.close()
        holder.wait(30)
    finally:
        for proc in (rank, holder):
            if proc.poll() is None:
                proc.kill()
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


def test_one_removal_at_a_time_and_none_waits_past_its_deadline(monkeypatch):
    """The exit hook (main thread) and the watchdog (its thread) never remove side by
    side while the other's removal is within its deadline: the watchdog's SIGKILL of the
    group would cut the other short. Past the deadline it removes anyway."""
    import threading

    from engine_patches import watchdog

    monkeypatch.delenv("OPSCTL_RUN_DIR", raising=False)
    path = f"/dev/shm/psm_opsctl_test_{os.urandom(4).hex()}"
    monkeypatch.setattr(watchdog, "_noted", {path})
    with open(path, "wb"):
        pass
    try:
        with watchdog._removal:  # the other thread's removal runs
            late = threading.Thread(target=watchdog._remove_tmp, args=(time.monotonic() + 60,))
            late.start()
            late.join(0.5)
            assert late.is_alive() and os.path.exists(path)  # it waits its turn
        late.join(30)
        assert not late.is_alive() and not os.path.exists(path)
        with open(path, "wb"):
            pass
        with watchdog._removal:  # the other's removal runs past the deadline: beside it
            watchdog._remove_tmp(until=time.monotonic() + 0.2)
            assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_the_engine_never_removes_a_tmpdir_opsctl_did_not_make_for_its_run(tmp_path, tmpdir_env):
    from engine_patches import private_tmp

    run, other = tmp_path / "r1", tmp_path / "r2"
    mine = engine_tmp.create(run)
    # vLLM's default kept (no private directory): the inherited TMPDIR is never touched
    assert private_tmp.remove_own({"OPSCTL_RUN_DIR": str(run), "TMPDIR": str(tmpdir_env)}) is None
    assert mine.is_dir() and tmpdir_env.is_dir()
    why = private_tmp.remove_own({"OPSCTL_RUN_DIR": str(other), "TMPDIR": str(mine) + "/"})
    assert "another run" in why and mine.is_dir()
    assert private_tmp.remove_own({"TMPDIR": str(mine)}) is None and mine.is_dir()
    assert private_tmp.remove_own({"OPSCTL_RUN_DIR": str(run), "TMPDIR": str(mine)}) is None
    assert not mine.exists()


MAKER = """
import os, sys
from multiprocessing import resource_tracker, shared_memory
from engine_patches import run_segments

def untracked(seg):  # as in the engine once its group is killed: no tracker unlinks it
    resource_tracker.unregister(seg._name, "shared_memory")
    return seg

assert run_segments.record_made() and run_segments.record_made()  # once, however asked
made = untracked(shared_memory.SharedMemory(create=True, size=4096))
other = untracked(shared_memory.SharedMemory(name=sys.argv[1]))  # opened, not made
pid = os.fork()
if pid == 0:  # a forked child (the EngineCore on one GPU) keeps the wrapper
    child = untracked(shared_memory.SharedMemory(create=True, size=4096))
    print(child.name, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(made.name, flush=True)
sys.stdin.read()
"""


def test_the_segments_a_run_makes_are_written_down_and_removed_with_it(tmp_path, tmpdir_env):
    """Every segment an engine process creates through multiprocessing.shared_memory
    (vLLM's ring buffers) is written down in its private TMPDIR as it is made, so the
    last one out removes it even when nobody saw it mapped (an EngineCore that made two
    after its owner died, then was killed by vLLM's deadline). Killed without unlinking
    anything: the removal finds and removes both, and not a segment it only opened."""
    import signal
    import subprocess
    import sys
    from multiprocessing import shared_memory

    from engine_patches import run_segments

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    d = engine_tmp.create(run)
    theirs = shared_memory.SharedMemory(create=True, size=4096)  # someone else's
    env = {**os.environ, **engine_tmp.engine_env(d), "OPSCTL_RUN_DIR": str(run)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    maker = subprocess.Popen(
        [sys.executable, "-c", MAKER, theirs.name], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    mine: list[str] = []
    try:
        mine = [maker.stdout.readline().strip(), maker.stdout.readline().strip()]
        assert all(n.startswith("psm_") for n in mine), mine
        assert run_segments.made(d) == sorted(mine)
        assert sorted(run_segments.run_names(d)) == sorted(mine)
        maker.send_signal(signal.SIGKILL)  # no unlink, no resource tracker's goodbye
        maker.wait(30)
        removed, kept = run_segments.remove(d, wait=5)
        assert sorted(removed) == sorted(mine) and kept == []
        assert os.path.exists(f"/dev/shm/{theirs.name}")
    finally:
        if maker.poll() is None:
            maker.kill()
        for n in mine:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{n}")
        theirs.close()
        theirs.unlink()
        engine_tmp.remove(d, run)


@contextlib.contextmanager
def as_api_server(script: str, *args: str) -> Iterator[tuple[int, str, str]]:
    """Run ``script`` with ``args`` (engine_patches importable) as opsctl runs an API
    server: in a session of its own, whose group is its engine; (exit code, stdout,
    stderr) once it ended. Leaving the block kills what is left of that group: a failure
    leaves no process behind."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPSCTL_RUN_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    server = subprocess.Popen(
        [sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = server.communicate(timeout=60)
        yield server.returncode, out, err
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


EXITING = """
import os, signal, subprocess, sys, threading
from engine_patches import watchdog

def vllms(signum, frame):  # vLLM's API server: SIGTERM raises wherever the main thread is
    raise KeyboardInterrupt("terminated")

signal.signal(signal.SIGTERM, vllms)
watchdog._bound_the_exit = lambda deadline: None  # this script judges the removal only
path = sys.argv[1]
holder = subprocess.Popen(  # a process that still holds the segment for a moment (not of
    # this group: the exit hook would wait for a rank to end, and then kill it, first)
    [sys.executable, "-c", "import sys; f = open(sys.argv[1], 'rb'); print('held', flush=True); "
     "sys.stdin.read()", path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    start_new_session=True)
assert holder.stdout.readline() == "held\\n"
watchdog._noted.add(path)

def watchdog_finds_the_owner_gone():
    while not watchdog._removal.locked():  # the exit hook's removal waits on the rank
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # what the watchdog sends when it finds it gone
    holder.stdin.close()  # then the rank lets go

threading.Thread(target=watchdog_finds_the_owner_gone, daemon=True).start()
watchdog._at_exit(os.getpid(), 0, os.getpid())  # owner "gone": start ticks 0 never match
holder.wait(30)
print("removed" if not os.path.exists(path) else "left", flush=True)
assert signal.getsignal(signal.SIGTERM) is vllms  # listening again after it
"""


def test_the_exit_hooks_removal_is_not_cut_short_by_a_sigterm(monkeypatch):
    """The API server's exit began (the parent-death signal), its removal waits for a
    rank to let go, and the watchdog's own SIGTERM arrives: vLLM's handler would raise
    KeyboardInterrupt in the middle of it (seen beside the CPU hog: both cpushm segments
    of serve --tp 2 stayed). The removal ends its work, then the handler is back."""
    path = f"/dev/shm/psm_opsctl_test_{os.urandom(4).hex()}"
    with open(path, "wb"):
        pass
    try:
        with as_api_server(EXITING, path) as (code, out, err):
            assert code == 0, err[-2000:]
        assert out.splitlines()[-1] == "removed"
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


LAST_WORDS = """
import signal, subprocess, sys, time
from multiprocessing import shared_memory
from engine_patches import watchdog

watchdog.KILL_AFTER = 1.0
ring = shared_memory.SharedMemory(create=True, size=4096)  # starts the resource tracker
ring.close()
ring.unlink()
stuck = subprocess.Popen(  # a rank whose own watchdog stopped with its finalization
    [sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
     "print('up', flush=True); signal.pause()"], stdout=subprocess.PIPE, text=True)
assert stuck.stdout.readline() == "up\\n"
done = subprocess.Popen([sys.executable, "-c", "pass"])  # a rank vLLM's shutdown ended:
while watchdog._running(done.pid):  # a zombie until multiprocessing joins it (after us)
    time.sleep(0.05)
(tracker,) = watchdog._helpers()
print("pids", stuck.pid, done.pid, tracker, flush=True)
watchdog._at_exit(1, -1, watchdog.os.getpid())  # owner "gone": start ticks -1 never match
print("stuck rank", stuck.wait(10), flush=True)
time.sleep(120)  # the rest of the exit hangs (a destructor, a join)
"""


def test_the_exit_hook_ends_ranks_still_running_and_bounds_the_rest_of_the_exit():
    """CI: after SIGKILL of `opsctl serve --tp 2` mid-start, its engine outlived it by
    over 20 s. A daemon thread stops for good once its interpreter finalizes, so past the
    exit hook the watchdog's SIGKILLs no longer bound the API server nor its ranks. The
    hook kills each rank still running at its own watchdog's deadline (not one vLLM's
    shutdown ended, not the resource tracker), then the kernel's alarm ends the server."""
    with as_api_server(LAST_WORDS) as (code, out, err):
        assert code == -signal.SIGALRM, (code, err[-2000:])
    lines = out.splitlines()
    stuck, ended, tracker = (int(x) for x in lines[0].split()[1:])
    assert tracker > 0 and tracker not in (stuck, ended)
    assert lines[1:] == [
        f"[opsctl] killed the ranks still running after its exit began: [{stuck}]",
        f"stuck rank {-signal.SIGKILL}",
    ]


TRACKER_KEPT = """
import multiprocessing, os, subprocess, sys
from engine_patches import watchdog

# vLLM's executor lock: a named semaphore in /dev/shm, registered with the tracker
lock = multiprocessing.get_context("spawn").Lock()
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
(tracker,) = watchdog._helpers()
print(lock._semlock.name, rank.pid, tracker, flush=True)
watchdog._kill_the_rest_of_my_group()
print("rank", rank.wait(10), flush=True)
os._exit(0)  # as by the server's own SIGKILL: no finalizer of its own unlinks the lock
"""


def test_the_watchdog_spares_the_resource_tracker_which_unlinks_what_the_engine_left():
    """A fresh clone beside the CPU hog: vLLM's executor lock (``sem.mp-*``) stayed in
    /dev/shm after SIGKILL of `serve --tp 2`: the watchdog's SIGKILL of the API server's
    group took its resource tracker too, which unlinks such leftovers once the last
    process of the engine is gone. The ranks are killed, the tracker is left to do it."""
    from tests.waiting import wait_until

    sem = None
    try:
        with as_api_server(TRACKER_KEPT) as (code, out, err):
            assert code == 0, err[-2000:]
            name, _, tracker = out.splitlines()[0].split()
            sem = Path(f"/dev/shm/sem.{name.lstrip('/')}")
            assert out.splitlines()[1] == f"rank {-signal.SIGKILL}"
            # before the session is killed: the tracker unlinks it once the rest is gone
            wait_until(lambda: not sem.exists(), 30, f"the tracker ({tracker}) to unlink {sem}")
    finally:
        if sem is not None:
            with contextlib.suppress(FileNotFoundError):
                sem.unlink()


def test_the_api_server_remembers_the_rendezvous_its_ranks_named_segments_after(
    tmp_path, tmpdir_env, monkeypatch
):
    """While its owner lives, the API server's watchdog remembers the rendezvous idents
    in its private TMPDIR. torch's FileStore deletes the file when the ranks shut down in
    order, which can end before the owner's death is seen: the ranks' cpushm segments,
    named after it, are still removed."""
    import subprocess
    import sys
    import threading

    from engine_patches import watchdog
    from tests.waiting import wait_until

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    d = engine_tmp.create(run)
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(run))
    monkeypatch.setattr(watchdog, "_idents", set())
    monkeypatch.setattr(watchdog, "_noted", set())
    ident = f"vllm_dist_opsctltest{os.urandom(4).hex()}"
    seg = f"/dev/shm/{ident}-tp:0-[0-1]-cpushm_0"
    owner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        ticks = wait_until(lambda: watchdog.start_ticks(owner.pid), 10, "the owner's stat")
        watch = threading.Thread(
            target=watchdog._watch_owner, args=(owner.pid, ticks, "api_server")
        )
        watch.start()
        (d / ident).write_text("")  # the ranks' rendezvous, then their segment
        with open(seg, "wb"):
            pass
        wait_until(lambda: ident in watchdog._idents, 30, "the ident remembered")
        (d / ident).unlink()  # FileStore's goodbye in the ranks' orderly shutdown
        owner.stdin.close()
        owner.wait(30)
        watch.join(30)
        assert not watch.is_alive()
        watchdog._remove_tmp(until=time.monotonic() + 1)
        assert not os.path.exists(seg) and not d.exists()
    finally:
        if owner.poll() is None:
            owner.kill()
        if os.path.exists(seg):
            os.unlink(seg)
        engine_tmp.remove(d, run)
