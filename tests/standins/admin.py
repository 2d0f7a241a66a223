"""A stand-in vLLM 0.32 server with the admin routes, for console actions and runs bundle.

A stand-in vLLM 0.32 server with the admin routes, for the console's actions and
``runs bundle``: /health, /version, /v1/models, /metrics (the recorded real body) and,
only in dev mode (like VLLM_SERVER_DEV_MODE=1), /server_info, /reset_prefix_cache,
/sleep, /wake_up, /is_sleeping, /pause, /resume, /is_paused; anything else is vLLM's
404 ``{"detail": "Not Found"}``. Every request is recorded in ``calls`` as
(method, path with query).

``python -m tests.standins.admin [--dev] [--model NAME] [--port N]`` serves in a
process of its own (the bundle test's "engine"), prints its URL, writes a vLLM-like
startup line holding its API key (as vLLM logs its non-default args), serves until
killed. :class:`StandInEngine` runs that process behind EngineServer's interface (run
directory with meta.json, wait_healthy, stop), so the console's serve / stop / restart
actions can be driven without vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil

from tests.standins.base import StandInVllm, serving
from tests.standins.vllm_server import METRICS  # the one recorded tiny-llama /metrics body

DEV_GET = {"/server_info", "/is_sleeping", "/is_paused"}
DEV_POST = {"/reset_prefix_cache", "/sleep", "/wake_up", "/pause", "/resume"}


def handler(dev: bool, model: str = "tiny-llama", root: str | None = None) -> type:
    """A fresh handler class (its own state) for one stand-in server."""

    class Admin(StandInVllm):
        DEV = dev
        VERSION = "0.32.0"
        calls: list[tuple[str, str]] = []
        state = {"sleeping": False, "paused": False, "level": 0}

        def refused(self) -> bool:
            self.calls.append((self.command, self.path))
            return False

        def models(self) -> list[dict]:
            return [{"id": model, "object": "model", "root": root or model, "max_model_len": 256}]

        def metrics_text(self) -> str:
            return METRICS

        def _send_text(self, code: int, body: str, ctype: str = "") -> None:
            super()._send_text(code, body, "text/plain; version=0.0.4")

        def get(self, path: str) -> bool:
            st = self.state
            if self.DEV and path == "/server_info":
                self._send(200, {"vllm_config": {"model": model}, "standin": True})
            elif self.DEV and path == "/is_sleeping":
                self._send(200, {"is_sleeping": st["sleeping"]})
            elif self.DEV and path == "/is_paused":
                self._send(200, {"is_paused": st["paused"]})
            else:
                return False
            return True

        def post(self, path: str, body: dict) -> bool:
            st = self.state
            if not (self.DEV and path in DEV_POST):
                return False
            if path == "/reset_prefix_cache":
                self._send(200, {"success": True})
            elif path == "/sleep":
                st["sleeping"] = True
                self._send(200, {"status": "sleeping", "level": 1})
            elif path == "/wake_up":
                st["sleeping"] = False
                self._send(200, {"status": "awake", "tags": None})
            elif path == "/pause":
                st["paused"] = True
                self._send(200, {"status": "paused"})
            else:  # /resume
                st["paused"] = False
                self._send(200, {"status": "resumed"})
            return True

    return Admin


@contextlib.contextmanager
def admin_server(dev: bool, model: str = "tiny-llama") -> Iterator[tuple[str, type]]:
    """(url, handler class) of a stand-in served in a thread."""
    h = handler(dev, model)
    with serving(h) as url:
        yield url, h


def main() -> None:
    """Serve one admin stand-in: ``--dev``, ``--model NAME``, ``--port N``."""
    dev = "--dev" in sys.argv
    model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "tiny-llama"
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler(dev, model))
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    key = os.environ.get("VLLM_API_KEY", "")
    print(f"INFO non-default args: {{'model': '{model}', 'api_key': ['{key}'], "
          "'tokenizer': '/models/tok', 'max_num_batched_tokens': 2048}", flush=True)  # fmt: skip
    print(f"DEBUG forwarding with Authorization: Bearer {key}", flush=True)
    print(json.dumps({"url": url}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        srv.serve_forever()


REPO = Path(__file__).resolve().parents[2]


class StandInEngine:
    """EngineServer's interface over a stand-in process (dev-mode admin routes)."""

    def __init__(self, opts) -> None:
        from opsctl.engine.server import free_port

        self.opts = opts
        self.port = opts.port or free_port()
        self.proc: subprocess.Popen | None = None
        self.run_dir: Path | None = None
        self.started_at = 0.0
        self.stop_report = None

    @property
    def url(self) -> str:
        """The stand-in's base URL on 127.0.0.1."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> StandInEngine:
        """Launch the stand-in as a child process with a run directory, like EngineServer."""
        from opsctl.engine.server import new_run_dir

        self.run_dir = new_run_dir(self.opts.label, self.opts.model.name, self.port)
        args = [sys.executable, "-m", "tests.standins.admin", "--dev", "--port", str(self.port),
                "--model", self.opts.model.name]  # fmt: skip
        log = (self.run_dir / "server.log").open("w")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.started_at = time.time()
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        me = psutil.Process()
        meta = {"url": self.url, "pid": self.proc.pid, "model": self.opts.model.name,
                "model_path": str(self.opts.model.path), "load_format": self.opts.load_format,
                "started_at": self.started_at, "owner_pid": me.pid,
                "owner_started": me.create_time(),
                "pids": {str(self.proc.pid): psutil.Process(self.proc.pid).create_time()}}  # fmt: skip
        (self.run_dir / "meta.json").write_text(json.dumps(meta))
        return self

    def wait_healthy(self, timeout: float) -> float:
        """Wait for /health 200 within ``timeout`` seconds; the seconds it took."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None and self.proc.poll() is None, "stand-in engine died"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return time.time() - self.started_at
            assert time.monotonic() < deadline, "stand-in engine never healthy"
            time.sleep(0.05)

    def stop(self):
        """SIGTERM the child once and stamp ``stopped_at`` in its meta; the StopReport of it."""
        from opsctl.engine.server import StopReport

        if self.stop_report is None:
            t0 = time.time()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(10)
            self.stop_report = StopReport(round(time.time() - t0, 3), ["SIGTERM api-server"],
                                          [], [], [], self.proc.returncode if self.proc else None)  # fmt: skip
            if self.run_dir is not None:
                meta = json.loads((self.run_dir / "meta.json").read_text())
                meta["stopped_at"] = time.time()
                (self.run_dir / "meta.json").write_text(json.dumps(meta))
        return self.stop_report


if __name__ == "__main__":
    main()
