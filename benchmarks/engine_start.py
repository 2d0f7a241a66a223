"""Where an engine start's seconds go: opsctl's launch vs bare vLLM with the same argv.

Starts a tiny-llama engine (dummy weights) ``--runs`` times each way (default 3) and
prints, per phase, the median seconds:

- ``api_server``: Popen -> EngineCore process created (API server imports vLLM, parses
  args, builds the config)
- ``engine_core``: EngineCore created -> Worker process created (spawn, import, executor)
- ``worker``: Worker created -> "Starting to load model" (spawn, import, distributed init)
- ``load_kv``: model load and KV cache sizing (-> "KV cache size")
- ``warmup``: profile, KV cache creation, warm-up (-> "init engine ... took")
- ``http_up``: API server wiring after the engine is ready (-> "Starting vLLM server on")
- ``health``: "Starting vLLM server on" -> the first /health 200 seen by the launcher

Three launches: ``opsctl`` (vLLM's layout, as ``opsctl serve`` starts it), ``bare vLLM``
(the same argv without opsctl's plugin) and ``opsctl 1p`` (the single-process layout of
opsctl's check engines: the API server forks the EngineCore, which runs the model; no
Worker, so its ``engine_core`` phase is 0 and ``worker`` is the EngineCore's own init).

Times come from process creation times (psutil) and from log lines stamped as they
appear (the log is tailed every 20 ms; vLLM runs unbuffered). "bare" is vLLM with the
argv and environment opsctl would use minus opsctl's plugin (no OPSCTL_RUN_DIR, so the
plugin stays inert), its /health polled at opsctl's interval.

    .venv/bin/python benchmarks/engine_start.py [--runs 3] [--model tiny-llama]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

MARKERS = (
    ("load_start", "Starting to load model"),
    ("kv_sized", "KV cache size"),
    ("engine_ready", "init engine (profile, create kv cache, warmup model) took"),
    ("http_up", "Starting vLLM server on"),
)
PHASES = ("api_server", "engine_core", "worker", "load_kv", "warmup", "http_up", "health")


class Watch:
    """Stamps the first appearance of each log marker and each child process role."""

    def __init__(self, log: Path, root_pid: int, t0: float) -> None:
        self.log, self.root_pid, self.t0 = log, root_pid, t0
        self.marks: dict[str, float] = {}
        self.procs: dict[str, float] = {}  # role -> create time
        self.roles: dict[int, str] = {}  # pid -> role, decided when first seen
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        offset = 0
        while not self.stop.wait(0.02):
            now = time.time()
            try:
                with open(self.log, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                    offset += len(chunk)
            except FileNotFoundError:
                chunk = b""
            text = chunk.decode(errors="replace")
            for name, marker in MARKERS:
                if name not in self.marks and marker in text:
                    self.marks[name] = now
            self._children()

    def _children(self) -> None:
        try:
            kids = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            return
        for p in kids:
            if p.pid in self.roles:
                continue  # each process gets its role once, when first seen
            try:
                cmd = " ".join(p.cmdline())
                created = p.create_time()
                parent = p.ppid()
            except psutil.Error:
                continue
            if "resource_tracker" in cmd or (
                parent != self.root_pid and "spawn_main" not in cmd and "Worker" not in p.name()
            ):
                self.roles[p.pid] = "other"  # resource tracker, compilers
                continue
            # the API server spawns (or forks) the EngineCore; the EngineCore spawns the
            # worker in vLLM's multiprocess layout
            role = "engine_core" if parent == self.root_pid else "worker"
            self.roles[p.pid] = role
            if role not in self.procs or created < self.procs[role]:
                self.procs[role] = created

    def phases(self, healthy_at: float) -> dict[str, float]:
        m, p = self.marks, self.procs
        points = [
            self.t0,
            p.get("engine_core"),
            # single process: no Worker, the EngineCore loads the model itself
            p.get("worker", p.get("engine_core")),
            m.get("load_start"),
            m.get("kv_sized"),
            m.get("engine_ready"),
            m.get("http_up"),
            healthy_at,
        ]
        out = {}
        for name, a, b in zip(PHASES, points, points[1:], strict=False):
            out[name] = round(b - a, 2) if a is not None and b is not None else float("nan")
        out["total"] = round(healthy_at - self.t0, 2)
        return out


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> float:
    from opsctl.engine.server import HEALTH_POLL_S

    deadline = time.time() + timeout
    with httpx.Client() as client:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode}")
            try:
                if client.get(url + "/health", timeout=2).status_code == 200:
                    return time.time()
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
    raise TimeoutError("engine did not become healthy")


def opsctl_start(model: str, single_process: bool = False) -> dict[str, float]:
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    server = EngineServer(
        LaunchOptions(
            model=resolve(model),
            load_format="dummy",
            label="bench-start",
            single_process=single_process,
        )
    )
    server.start()
    watch = Watch(server.log_path, server.pid, server.started_at)
    try:
        server.wait_healthy(600)
        return watch.phases(server.healthy_at)
    finally:
        watch.stop.set()
        server.stop()


def bare_start(model: str) -> dict[str, float]:
    from opsctl.engine.model import resolve
    from opsctl.engine.server import LaunchOptions, build_argv, build_env, free_port

    opts = LaunchOptions(model=resolve(model), load_format="dummy", label="bench-bare")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ob-", dir="/tmp") as tmp:
        env = build_env(opts, Path(tmp))
        for name in list(env):
            if name.startswith("OPSCTL_"):
                del env[name]
        env["TMPDIR"] = tmp
        log = Path(tmp) / "server.log"
        shm_before = set(os.listdir("/dev/shm"))
        with open(log, "wb") as fh:
            t0 = time.time()
            proc = subprocess.Popen(
                build_argv(opts, port), stdout=fh, stderr=subprocess.STDOUT, env=env,
                cwd=tmp, start_new_session=True,
            )  # fmt: skip
            watch = Watch(log, proc.pid, t0)
            try:
                healthy = _wait_healthy(f"http://127.0.0.1:{port}", proc)
                return watch.phases(healthy)
            finally:
                watch.stop.set()
                _kill_tree(proc, shm_before)


def _kill_tree(proc: subprocess.Popen, shm_before: set[str]) -> None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.kill()
    psutil.wait_procs(kids, timeout=10)
    # a bare server leaves its ring buffers: remove the ones this start made, now that
    # every process of its tree is gone
    for name in set(os.listdir("/dev/shm")) - shm_before:
        if name.startswith(("psm_", "sem.mp-")):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default="tiny-llama")
    args = ap.parse_args()
    os.environ.setdefault("OPSCTL_HOME", str(Path(__file__).resolve().parents[1] / ".opsctl-home"))
    launches = (
        ("opsctl", opsctl_start),
        ("bare vLLM", bare_start),
        ("opsctl 1p", lambda m: opsctl_start(m, single_process=True)),
    )
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in launches}
    for i in range(args.runs):
        for name, fn in launches:
            r = fn(args.model)
            results[name].append(r)
            print(f"run {i + 1} {name:9}: " + " ".join(f"{k}={v}" for k, v in r.items()),
                  file=sys.stderr, flush=True)  # fmt: skip
    cols = (*PHASES, "total")
    print(f"engine start of {args.model} (dummy weights), median of {args.runs}, seconds")
    print(f"{'launch':10}" + "".join(f"{c:>12}" for c in cols))
    for name, rows in results.items():
        med = [statistics.median(r[c] for r in rows) for c in cols]
        print(f"{name:10}" + "".join(f"{v:12.2f}" for v in med))
    return 0


if __name__ == "__main__":
    sys.exit(main())
