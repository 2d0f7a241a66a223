"""opsctl stacks on real processes (no engine: the collector and the probe are the same
for any Python process): a child that applied the stack_dump probe and wrote its ledger
as an engine process does, blocked on a lock in a function named ``planted_hang``; a
child without the probe, read by py-spy. Both stay alive: taking stacks stops nothing.
The vLLM engine case is tests/e2e/test_console_e2e.py::test_stacks_of_a_real_engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from opsctl.stacks import collect as col
from opsctl.stacks import judge as dom
from tests.waiting import wait_until

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    armed = sys.argv[1] == "armed"
    if armed:
        from engine_patches.registry import apply_patch, write_ledger
        from engine_patches.patches import stack_dump
        rec = apply_patch(stack_dump.PATCH, "engine_core", "0.32.0")
        write_ledger({"pid": os.getpid(), "role": "engine_core", "patches": [rec]}, None)
    lock = threading.Lock()
    lock.acquire()
    def planted_hang():
        print("ready", flush=True)
        lock.acquire()  # never released: the hang the stacks must name
    threading.Thread(target=lambda: threading.Event().wait(), name="idle", daemon=True).start()
    planted_hang()
    """
)


@pytest.fixture
def child(tmp_path):
    procs = []

    def start(mode: str):
        env = {**os.environ, "OPSCTL_RUN_DIR": str(tmp_path)}
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(10)


def test_an_armed_process_dumps_on_the_signal_and_lives_on(child, tmp_path):
    p = child("armed")
    wait_until(
        lambda: (tmp_path / "ledger").is_dir() and any((tmp_path / "ledger").iterdir()),
        30,
        "ledger",
    )
    assert col.armed_pids(tmp_path) == {p.pid}
    (got,) = col.take(p.pid, tmp_path, timeout=10)
    assert got.source == "signal" and got.error is None
    assert "planted_hang" in got.verdict() and "via threading" not in got.verdict()
    assert got.verdict().startswith(f"{got.role} (pid {p.pid}): in planted_hang") or (
        "planted_hang" in got.verdict()
    )
    assert {t.current for t in got.threads} == {True, False}
    assert psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and p.poll() is None
    # a second take reads only the new dump
    (again,) = col.take(p.pid, tmp_path, timeout=10)
    assert len(again.threads) == len(got.threads)


@pytest.mark.skipif(col.pyspy_path() is None, reason="py-spy is a dependency: install it")
def test_a_process_without_the_probe_is_read_by_py_spy_and_never_signalled(child, tmp_path):
    p = child("plain")
    (got,) = col.take(p.pid, tmp_path, timeout=20)
    assert p.poll() is None  # SIGUSR2 was not sent: it would have killed it
    if got.source == "none":  # tracing not allowed here: the line says why
        assert "py-spy" in got.error, got.error
        return
    assert got.source == "py-spy"
    assert any(f.func == "planted_hang" for t in got.threads for f in t.frames)


def test_a_stopped_armed_process_is_not_signalled(child, tmp_path):
    p = child("armed")
    wait_until(lambda: col.armed_pids(tmp_path) == {p.pid}, 30, "ledger")
    os.kill(p.pid, 19)  # SIGSTOP: it could not run the handler
    try:
        wait_until(lambda: psutil.Process(p.pid).status() == psutil.STATUS_STOPPED, 10, "stopped")
        t0 = time.monotonic()
        (got,) = col.take(p.pid, tmp_path, timeout=5)
        assert got.state == "stopped" and got.verdict().startswith(
            f"{got.role} (pid {p.pid}) [stopped]"
        )
        assert got.source in ("py-spy", "none")
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(p.pid, 18)  # SIGCONT


def test_without_py_spy_an_unread_process_gets_the_true_reason(child, tmp_path, monkeypatch):
    """Issue 45 item 4: an armed process that is stopped cannot run its handler (the old
    line said no handler was armed); one opsctl did not arm is not armed; both say how to
    install py-spy. Neither is signalled (SIGUSR2 would kill the unarmed one)."""
    monkeypatch.setattr(col, "pyspy_path", lambda: None)
    armed, plain = child("armed"), child("plain")
    wait_until(lambda: col.armed_pids(tmp_path) == {armed.pid}, 30, "ledger")
    os.kill(armed.pid, 19)  # SIGSTOP
    try:
        wait_until(lambda: psutil.Process(armed.pid).status() == "stopped", 10, "stopped")
        (got,) = col.take_once(armed.pid, tmp_path, timeout=5)
    finally:
        os.kill(armed.pid, 18)
    assert got.source == "none" and got.state == "stopped"
    assert got.error.startswith("stopped: its stack handler (SIGUSR2) cannot run"), got.error
    assert "no stack handler armed" not in got.error
    assert got.error.endswith(f"py-spy is not installed ({sys.executable} -m pip install py-spy)")
    (other,) = col.take_once(plain.pid, tmp_path, timeout=5)
    assert other.error.startswith("no stack handler armed (not started by opsctl")
    assert "pip install py-spy" in other.error and plain.poll() is None


def test_parse_group_and_where():
    text = (
        "Thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
        '  File "/x/site-packages/vllm/v1/engine/core.py", line 912 in run_busy_loop\n'
        "\n"
        "Current thread 0x2 (most recent call first):\n"
        '  File "/x/site-packages/vllm/v1/engine/core.py", line 900 in step\n'
    )
    threads = dom.parse_faulthandler(text)
    assert [t.ident for t in threads] == ["0x1", "0x2"] and threads[1].current
    p = dom.ProcessStacks(7, "EngineCore", "signal", threads, "sleeping")
    # the main thread (no threading._bootstrap at its bottom), not where the signal landed
    assert p.verdict() == (
        "EngineCore (pid 7): waits in run_busy_loop (vllm/v1/engine/core.py:912) via threading.wait"
    )
    # a thread started by threading is never the main one, wherever the signal landed
    bootstrap = dom.Frame("_bootstrap", "/usr/lib/python3.11/threading.py", 1002)
    helper = dom.Thread("0x3", (threads[1].frames[0], bootstrap), current=True)
    assert dom.ProcessStacks(7, "EngineCore", "signal", (threads[0], helper)).main is threads[0]
    assert dom.where(threads[0].frames) == (
        "waits in run_busy_loop (vllm/v1/engine/core.py:912) via threading.wait"
    )
    q = dom.ProcessStacks(8, "Worker", "signal", threads, "sleeping")
    groups = dom.group([p, q])
    assert [len(g.members) for g in groups] == [2, 2]
    # two dumps in one text: the last one counts
    assert len(dom.parse_faulthandler(text + text)) == 2


def test_a_stacks_document_follows_its_schema(child, tmp_path, monkeypatch):
    """The library's document for a (non-vLLM) armed process, through the check's own
    assembly (resolve() is what refuses a non-vLLM pid; it is bypassed here)."""
    from opsctl.stacks import run as check
    from tests.cli.test_json_schemas import validate

    p = child("armed")
    wait_until(lambda: col.armed_pids(tmp_path) == {p.pid}, 30, "ledger")
    monkeypatch.setattr(check, "resolve", lambda target: (p.pid, tmp_path))
    doc = check.run(str(p.pid), check.Options(timeout=10, interval=0.3)).to_dict()
    validate(doc)
    # blocked on a lock at one frame, asleep at both takes: stuck, and named
    assert doc["verdict"] == "stuck" and doc["processes"][0]["source"] == "signal", doc["headline"]
    assert doc["processes"][0]["moved"] is False and doc["processes"][0]["asleep"] is True
    (culprit,) = doc["culprits"]
    assert culprit["pid"] == p.pid and culprit["line"].startswith("in planted_hang"), culprit
    assert doc["host"] == socket.gethostname() and doc["interval"] == 0.3


def test_native_stacks_show_the_c_frames_under_the_python_ones(child, tmp_path):
    """--native: py-spy unwinds the C frames too (it refuses that in non-blocking mode, so
    this read pauses the process once); an armed process is read by py-spy, not
    signalled, and lives on."""
    p = child("armed")
    wait_until(lambda: col.armed_pids(tmp_path) == {p.pid}, 30, "ledger")
    (got,) = col.take(p.pid, tmp_path, timeout=20, native=True)
    assert p.poll() is None
    if got.source == "none":  # tracing not allowed here: the line says why
        assert "py-spy may not trace" in got.error, got.error
        return
    assert got.source == "py-spy", got.error
    frames = [f for t in got.threads for f in t.frames]
    assert any(f.func == "planted_hang" for f in frames)
    assert any(not (f.file or "").endswith(".py") for f in frames), frames  # a C frame


def test_a_native_verdict_names_the_c_function_and_the_python_frame_above_it():
    frames = (
        dom.Frame("0x7f1d77ea3e96", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0),
        dom.Frame("cudaStreamSynchronize", "/tmp/site/nvidia/cu13/lib/libcudart.so.13", 0),
        dom.Frame("synchronize", "/tmp/site/torch/cuda/streams.py", 92),
        dom.Frame("planted_gpu_hang", "/repo/engine_patches/patches/gpu_hang_knob.py", 46),
    )
    assert dom.where(frames) == (
        "waits in cudaStreamSynchronize (libcudart.so.13) under planted_gpu_hang "
        "(/repo/engine_patches/patches/gpu_hang_knob.py:46)"
    )
    assert dom.where(frames[2:]).startswith("waits in planted_gpu_hang")
    assert dom.where(frames[2:]).endswith("via streams.synchronize")


def test_a_runnable_read_is_read_again_and_a_computing_process_stays_working(monkeypatch):
    """CI-like load: a child blocked on a lock read "running" at one take (woken by the
    previous take's signal, or not yet in its wait) and its stacks read working."""
    reads = iter(["running", "running", "sleeping"])

    class Seen:
        def __init__(self, pid):
            pass

        def status(self):
            return next(reads)

    monkeypatch.setattr(col.psutil, "Process", Seen)
    assert col._settled([(1, "r", "running")]) == [(1, "r", "sleeping")]  # settles within the reads
    assert col._settled([(1, "r", "stopped")]) == [(1, "r", "stopped")]  # not runnable: not read
    monkeypatch.setattr(Seen, "status", lambda self: "running")
    assert col._settled([(1, "r", "running")]) == [(1, "r", "running")]  # computing: stays runnable
