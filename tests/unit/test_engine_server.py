"""EngineServer's process bookkeeping, with real (non-vLLM) child processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest

from opsctl.engine.server import EngineServer
from tests.waiting import wait_until


def test_a_reused_pid_is_never_treated_as_ours():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server = EngineServer.__new__(EngineServer)  # bookkeeping only: no engine
        server.known_pids, server.run_dir, server.stop_report = {}, None, None
        server._remember([child.pid])
        assert server.known_pids[child.pid] == psutil.Process(child.pid).create_time()
        assert [p.pid for p in server._living([child.pid])] == [child.pid]
        # the same pid with another start time: a different process that got our old pid
        server.known_pids[child.pid] -= 5.0
        assert server._living([child.pid]) == []
    finally:
        child.kill()
        child.wait()


def test_engine_lock_is_shared_within_a_process_and_held_against_others(tmp_path, monkeypatch):
    """Two engines of one process (a session holding two, the console starting two) used
    to wait for ever on their own flock; other processes must still queue."""
    from opsctl.engine.registry import StartQueue

    path = tmp_path / "engine.lock"
    monkeypatch.setenv("OPSCTL_ENGINE_LOCK", str(path))
    lock = StartQueue()
    probe = (
        "import fcntl, sys; fh = open(sys.argv[1]); fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )

    def others_can_take_it() -> bool:
        r = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True)
        return r.returncode == 0

    first, second = lock.acquire(), lock.acquire()  # returns at once: no self-deadlock
    assert first is second and lock.count == 2
    assert not others_can_take_it()
    lock.release()
    assert not others_can_take_it()  # the other engine still runs
    lock.release()
    assert others_can_take_it()


# An owner that forks the API server and is SIGKILLed before the child's preexec_fn
# sets the parent-death signal: the window is widened here by having the child wait,
# inside preexec_fn, until its owner is gone, then run opsctl's real preexec_fn.
LATE_PDEATHSIG = """
import os, subprocess, sys, time
from opsctl.engine.server import _parent_death_signal
owner, marker, pidfile = os.getpid(), sys.argv[1], sys.argv[2]
real = _parent_death_signal(owner)
def preexec():
    with open(pidfile, "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    while os.getppid() == owner and time.monotonic() < deadline:
        time.sleep(0.01)
    real()
subprocess.Popen([sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", marker],
                 preexec_fn=preexec)
"""


def test_a_server_whose_owner_dies_before_the_parent_death_signal_is_set_never_runs(tmp_path):
    """prctl(PR_SET_PDEATHSIG) only covers a death after the call: an owner SIGKILLed
    between fork and prctl left the API server running until the plugin's watchdog."""
    marker, pidfile = tmp_path / "ran", tmp_path / "pid"
    owner = subprocess.Popen([sys.executable, "-c", LATE_PDEATHSIG, str(marker), str(pidfile)])
    try:
        pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 30, "the fork"))
        owner.kill()
        owner.wait(10)

        def exited() -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_until(exited, 30, f"the orphaned child {pid} to exit")
        assert not marker.exists(), "the child exec'd its command after its owner died"
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_parent_death_preexec_lets_a_child_of_a_live_owner_run(tmp_path):
    from opsctl.engine.server import _parent_death_signal

    marker = tmp_path / "ran"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'w')", str(marker)],
        preexec_fn=_parent_death_signal(os.getpid()),
    )
    assert child.wait(60) == 0
    assert marker.exists()


# A stand-in API server for the port race: it binds host:port the way vLLM's
# create_server_socket does (SO_REUSEADDR, bind, listen; an OSError with errno 98 when
# taken) once the gate file exists, then answers /health. Everything around it is
# EngineServer's own code: port choice, launch, the wait for health, stop.
BINDING_SERVER = """
import http.server, os, sys, time
port, gate = int(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 60
while gate and not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.01)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("INFO stand-in binding", port, flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _race_server(tmp_path, monkeypatch, picks, port=None, gate=""):
    """An EngineServer on the stand-in; ``picks`` are the ports free_port hands out."""
    import itertools

    from opsctl.engine import server as srv
    from opsctl.engine.model import ResolvedModel
    from opsctl.engine.server import LaunchOptions

    monkeypatch.delenv("OPSCTL_ENGINE_LOCK", raising=False)
    monkeypatch.setattr(
        srv, "build_argv", lambda opts, p: [sys.executable, "-c", BINDING_SERVER, str(p), gate]
    )
    picks = itertools.chain(picks, itertools.repeat(picks[-1]))
    monkeypatch.setattr(srv, "free_port", lambda host="127.0.0.1": next(picks))
    run_dir = tmp_path / "run"
    model = ResolvedModel("tiny-llama", tmp_path, "decoder", True, {})
    return srv.EngineServer(LaunchOptions(model=model, port=port, run_dir=run_dir))


def _listening(port: int = 0) -> socket.socket:
    """A socket listening on 127.0.0.1:port (0: a port the kernel picks)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_chosen_port_taken_before_the_server_binds_it_is_replaced(tmp_path, monkeypatch):
    """CI saw it: the port opsctl chose was taken during vLLM's ~10 s of imports, and the
    check died of `[Errno 98] Address already in use`. The server starts again on a
    new port, within the same wait, and the dead launch leaves nothing behind."""
    from opsctl.engine.server import free_port

    taken = _listening()
    port_taken = taken.getsockname()[1]
    fresh = free_port()
    server = _race_server(tmp_path, monkeypatch, [port_taken, fresh])
    try:
        with taken:
            server.start()
            first_pid = server.pid
            server.wait_healthy(60)
            assert server.port == fresh and server.url.endswith(f":{fresh}")
            assert server.pid != first_pid and not psutil.pid_exists(first_pid)
            log = server.log_text()
            assert "Address already in use" in log
            assert f"port {port_taken} was taken before the server bound it" in log
            assert server.launch_log_text().startswith(f"INFO stand-in binding {fresh}")
    finally:
        report = server.stop()
    assert report.leftover_pids == []


def test_a_port_taken_every_time_gives_up_after_the_retries(tmp_path, monkeypatch):
    from opsctl.engine import server as srv
    from opsctl.errors import EngineDied

    taken = _listening()
    port_taken = taken.getsockname()[1]
    server = _race_server(tmp_path, monkeypatch, [port_taken])
    try:
        with taken, pytest.raises(EngineDied, match="Address already in use"):
            server.start()
            server.wait_healthy(60)
        assert server.log_text().count("was taken before the server bound it") == srv.PORT_RETRIES
    finally:
        assert server.stop().leftover_pids == []


def test_a_port_the_operator_named_is_never_swapped(tmp_path, monkeypatch):
    """`--port 8000` taken between opsctl's check and vLLM's bind is the operator's to
    know about: the engine dies with the reason, on no other port."""
    from opsctl.engine.server import free_port
    from opsctl.errors import EngineDied

    gate = tmp_path / "bind-now"
    named = free_port()
    server = _race_server(tmp_path, monkeypatch, [free_port()], port=named, gate=str(gate))
    try:
        server.start()
        with _listening(named), pytest.raises(EngineDied, match="Address already in use"):
            gate.touch()
            server.wait_healthy(60)
        assert server.port == named and "was taken" not in server.log_text()
    finally:
        assert server.stop().leftover_pids == []


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    """Ports from bind(0) are the kernel's to hand out again (vLLM's own ZMQ and
    torch.distributed ports, every outgoing connection): opsctl's come from below."""
    from opsctl.engine.server import _PICK_SPAN, _ephemeral_low, free_port, port_free

    lo = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(max(1024, lo - _PICK_SPAN) <= p < lo for p in ports), ports
    assert len(ports) > 1  # random, not one port every caller shares
    assert all(port_free("127.0.0.1", p) for p in ports)


def test_the_launch_log_reads_like_the_whole_log(tmp_path):
    """Both views of server.log decode alike (tqdm's \\r ends a line, a bad byte is
    replaced); the launch's view starts where the launch began."""
    from opsctl.engine.server import EngineServer

    server = EngineServer.__new__(EngineServer)  # the log views only: no engine
    server.run_dir = tmp_path
    first = b"dead launch\r\n"
    (tmp_path / "server.log").write_bytes(first + b"shards 1/2\rshards 2/2\r\nbad \xff\n")
    server._log_from = len(first)
    assert server.log_text() == "dead launch\nshards 1/2\nshards 2/2\nbad \ufffd\n"
    assert server.launch_log_text() == "shards 1/2\nshards 2/2\nbad \ufffd\n"


# A stand-in engine whose every process, once asked to stop, ignores SIGTERM and keeps
# making /dev/shm segments (each kept mapped) until SIGKILL: the ring buffers a TP=2
# engine stopped mid-start made during the stop's polite phase, after the last look at
# what it mapped (CI, tp-sigint: two psm_ segments left linked).
MAKING_SEGMENTS = """
import mmap, multiprocessing as mp, os, signal, sys, time
prefix = sys.argv[1]
def make(tag, started=None):
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    if started is not None:
        started.set()
    keep, i = [], 0
    while True:
        time.sleep(0.005)
        if stop:
            fd = os.open(f"/dev/shm/{prefix}{tag}-{i}", os.O_CREAT | os.O_RDWR, 0o600)
            os.ftruncate(fd, 4096)
            keep.append(mmap.mmap(fd, 4096))
            os.close(fd)
            i += 1
if __name__ == "__main__":
    started = mp.get_context("fork").Event()
    mp.get_context("fork").Process(target=make, args=("core", started)).start()
    started.wait(30)
    print("INFO stand-in ready", flush=True)
    make("api")
"""


def test_segments_made_while_the_stop_waits_are_removed_after_sigkill(tmp_path, monkeypatch):
    import uuid

    from opsctl.collectors import shm
    from opsctl.engine import server as srv
    from opsctl.engine.model import ResolvedModel
    from opsctl.engine.server import LaunchOptions

    prefix = f"opsctl-unit-{uuid.uuid4().hex[:8]}-"
    monkeypatch.delenv("OPSCTL_ENGINE_LOCK", raising=False)
    monkeypatch.setattr(
        srv, "build_argv", lambda opts, p: [sys.executable, "-c", MAKING_SEGMENTS, prefix]
    )
    model = ResolvedModel("tiny-llama", tmp_path, "decoder", True, {})
    server = srv.EngineServer(LaunchOptions(model=model, run_dir=tmp_path / "run"))

    def ours() -> set[str]:
        return {f.name for f in shm.list_files() if f.name.startswith(prefix)}

    try:
        server.start()
        wait_until(
            lambda: "stand-in ready" in server.log_text(), 60, "the stand-in's two processes"
        )
        report = server.stop(grace=2.0)
        assert "SIGKILL" in report.signals and report.leftover_pids == []
        made = set(report.shm_removed)
        assert {n.split("-")[3] for n in made} == {"api", "core"}, made  # both kept making
        assert ours() == set(), f"left linked: {sorted(ours())}"
    finally:
        for name in ours():
            (shm.SHM / name).unlink(missing_ok=True)


def test_the_first_death_has_the_api_servers_exit_code_though_another_call_reaped_it(
    tmp_path, monkeypatch
):
    """Beside a CPU hog (TP=2, Worker_TP1 SIGKILLed) the API server exited between the
    last track() and the caller's exited(), which reaped it: the verdict said its exit code
    was never seen ("gone"). first_death() notes the end itself."""
    from opsctl.engine import server as srv
    from opsctl.engine.model import ResolvedModel
    from opsctl.engine.server import LaunchOptions

    monkeypatch.delenv("OPSCTL_ENGINE_LOCK", raising=False)
    gate = tmp_path / "exit-now"
    waits = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    monkeypatch.setattr(srv, "build_argv", lambda opts, p: [sys.executable, "-c", waits])
    model = ResolvedModel("tiny-llama", tmp_path, "decoder", True, {})
    server = srv.EngineServer(LaunchOptions(model=model, run_dir=tmp_path / "run"))
    try:
        server.start()
        server.track()  # while it runs, as supervision does every second
        assert server.exited() is None
        gate.write_text("")
        wait_until(lambda: server.exited() is not None, 60, "the stand-in's exit")
        death = server.first_death()
        assert death is not None and death.role == "APIServer", death
        assert death.exitcode == 0 and death.cause == "exited with code 0", death.to_dict()
    finally:
        server.stop(grace=2.0)
