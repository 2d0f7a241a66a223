"""A bare vLLM OpenAI server started WITHOUT opsctl (no run dir, no plugin env), for
the console's discovery tests, the /metrics recording and the vllmstat comparison.

It holds the engine lock (OPSCTL_ENGINE_LOCK) while it runs, like opsctl's own engines,
and on exit stops the whole process tree with psutil and removes only the /dev/shm
segments that appeared while it ran and that no live process maps.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from opsctl.engine.server import free_port
from tests.standins.shm_watch import TreeShm

API_MODULE = "vllm.entrypoints.openai.api_server"
STARTS: list[float] = []  # seconds from spawn to healthy, per server (the suite's summary)


@dataclass
class BareServer:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def _engine_lock() -> Iterator[None]:
    path = os.environ.get("OPSCTL_ENGINE_LOCK")
    if not path:
        yield
        return
    try:
        fh = open(path)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        fh = open(path, "a")  # noqa: SIM115 - closed below
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        fh.close()


@contextlib.contextmanager
def no_inner_lock() -> Iterator[None]:
    """For a module that holds the engine lock itself around several engines: a second
    flock from this process on another descriptor would wait for ourselves."""
    saved = os.environ.pop("OPSCTL_ENGINE_LOCK", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["OPSCTL_ENGINE_LOCK"] = saved


def _remove_left(watch) -> None:
    """Unlink what the bare server's own tree held and left (vLLM leaves its ring buffers
    and semaphores when killed), never a segment a live process still maps or holds."""
    from opsctl.collectors import shm

    left = watch.left()
    if not left:
        return
    held = shm.scan_holders().held_paths()
    for name in left:
        if f"/dev/shm/{name}" not in held:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def stop_tree(root_pid: int, grace: float = 10.0) -> None:
    """SIGTERM the root, then every descendant; SIGKILL what is left after the grace."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.resume()  # a SIGSTOPped process never handles SIGTERM
    with contextlib.suppress(psutil.NoSuchProcess):
        root.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace * 0.5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace * 0.3)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace * 0.2)


def wait_healthy(server: BareServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"bare vLLM exited {server.proc.returncode}: {server.log_text()[-2000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"bare vLLM not healthy within {timeout} s: {server.log_text()[-2000:]}")


@contextlib.contextmanager
def bare_vllm(
    model_dir: str,
    *,
    load_format: str = "dummy",
    timeout: float = 400.0,
    api_key: str | None = None,
) -> Iterator[BareServer]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSCTL_")}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.pop("VLLM_API_KEY", None)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    with _engine_lock():
        port = free_port()
        argv = [
            sys.executable, "-m", API_MODULE, "--model", model_dir,
            "--served-model-name", "tiny-llama", "--load-format", load_format,
            "--dtype", "float32", "--max-model-len", "256", "--enforce-eager",
            "--max-num-seqs", "8", "--gpu-memory-utilization", "0.5",
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        log_path = Path(tempfile.mkstemp(prefix="bare-vllm-", suffix=".log")[1])
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        server = BareServer(proc, port, log_path)
        watch = TreeShm(proc.pid).__enter__()  # the segments this server's tree holds
        t0 = time.monotonic()
        try:
            wait_healthy(server, timeout)
            STARTS.append(time.monotonic() - t0)
            yield server
        finally:
            stop_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            watch.__exit__(None, None, None)
            _remove_left(watch)
            with contextlib.suppress(OSError):
                log_path.unlink()
