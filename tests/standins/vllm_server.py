"""Stand-in vLLM endpoints in modes, many ports on one asyncio thread (console, benchmark).

Stand-in vLLM endpoints for the console's tests and benchmark: one asyncio thread
serves many ports, each in a mode, with a recorded real vLLM 0.32 /metrics body
(tests/data/vllm_metrics_tiny_llama.txt) whose key samples follow the mode.

Modes: healthy (idle, ready), busy (requests running, tokens advancing), stalled
(requests running, generation flat, /health 200), hung (accepts the connection, never
answers), dead (/health 503), unauthorized (401 everywhere), notvllm (an HTTP server
that is not vLLM). ``set_mode`` switches a live endpoint (recovery, restarts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"
METRICS = (DATA / "vllm_metrics_tiny_llama.txt").read_text()
INFO = json.loads((DATA / "vllm_info_tiny_llama.json").read_text())
MODES = ("healthy", "busy", "stalled", "hung", "dead", "unauthorized", "notvllm")
KEY = "sekrit"  # mode "keyed": like vLLM with --api-key, /v1/* needs "Bearer sekrit"


def render_metrics(base: str, values: dict[str, float]) -> str:
    """The recorded body with the samples whose name{...} starts with a key replaced."""
    out = []
    for line in base.splitlines():
        for prefix, v in values.items():
            if line.startswith(prefix + "{") or line.startswith(prefix + " "):
                line = line.rsplit(" ", 1)[0] + f" {float(v)}"
                break
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass
class Endpoint:
    """One stand-in endpoint: its mode, port and moving counters."""

    mode: str
    port: int = 0
    gen: float = 737.0  # generation tokens counter (the recorded value)
    steps: float = 737.0
    epoch: float = field(default_factory=time.monotonic)
    hits: int = 0
    frozen: bool = False  # busy: counters only as set (a recorded scrape), not by the clock

    @property
    def url(self) -> str:
        """The endpoint's base URL on 127.0.0.1."""
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """The recorded /metrics body with this mode's running count and counters."""
        running = {"busy": 4.0, "stalled": 16.0}.get(self.mode, 0.0)
        if self.mode == "busy" and not self.frozen:  # 200 tokens/s in 4 steps/s
            dt = time.monotonic() - self.epoch
            self.gen, self.steps, self.epoch = (
                self.gen + 200 * dt,
                self.steps + 4 * dt,
                time.monotonic(),
            )
        return render_metrics(
            METRICS,
            {
                "vllm:num_requests_running": running,
                "vllm:generation_tokens_total": self.gen,
                "vllm:iteration_tokens_total_count": self.steps,
            },
        )


def _response(code: int, body: str, ctype: str = "text/plain") -> bytes:
    data = body.encode()
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}
    head = (
        f"HTTP/1.1 {code} {reason.get(code, 'X')}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(data)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + data


def answer(ep: Endpoint, path: str, auth: str = "") -> bytes:
    """The raw HTTP response of endpoint ``ep`` to a GET of ``path``."""
    ep.hits += 1
    if ep.mode == "keyed" and path.startswith("/v1/") and auth != f"Bearer {KEY}":
        return _response(401, '{"error":"Unauthorized"}', "application/json")
    if ep.mode == "unauthorized":
        return _response(401, '{"error":"Unauthorized"}', "application/json")
    if ep.mode == "notvllm":
        return (
            _response(200, "<html>hello</html>", "text/html")
            if path == "/"
            else _response(404, "nope")
        )
    if path == "/health":
        return _response(503 if ep.mode == "dead" else 200, "")
    if path == "/metrics":
        return _response(200, ep.metrics(), "text/plain; version=0.0.4")
    if path == "/version":
        return _response(200, json.dumps(INFO["version"]), "application/json")
    if path == "/v1/models":
        return _response(200, json.dumps(INFO["models"]), "application/json")
    return _response(404, '{"detail":"Not Found"}', "application/json")


class StandInFleet:
    """Starts endpoints on free 127.0.0.1 ports; use as a context manager."""

    def __init__(self, modes: list[str]) -> None:
        self.endpoints = [Endpoint(m) for m in modes]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.servers: list = []
        self.hung_socks: list[socket.socket] = []

    def __enter__(self) -> StandInFleet:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            for s in self.servers:
                s.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        for s in self.hung_socks:
            s.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _start(self) -> None:
        for ep in self.endpoints:
            if ep.mode == "hung":  # listens (the kernel completes connects), never accepts
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sock.listen(1024)
                self.hung_socks.append(sock)
                ep.port = sock.getsockname()[1]
                continue
            server = await asyncio.start_server(
                lambda r, w, ep=ep: self._serve(ep, r, w), "127.0.0.1", 0
            )
            self.servers.append(server)
            ep.port = server.sockets[0].getsockname()[1]

    async def _serve(self, ep: Endpoint, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode().split("?")[0]
                auth = ""
                for line in head.decode(errors="replace").split("\r\n"):
                    if line.lower().startswith("authorization:"):
                        auth = line.split(":", 1)[1].strip()
                if ep.mode == "hung":
                    await asyncio.Event().wait()
                writer.write(answer(ep, path, auth))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, IndexError):
            pass
        finally:
            writer.close()

    def set_mode(self, i: int, mode: str) -> None:
        """Switch endpoint ``i`` to ``mode`` while it serves."""
        self.endpoints[i].mode = mode

    def reset_counters(self, i: int) -> None:
        """A restart: the counters start again near zero."""
        ep = self.endpoints[i]
        ep.gen, ep.steps, ep.epoch = 1.0, 1.0, time.monotonic()

    @property
    def urls(self) -> list[str]:
        """Every endpoint's base URL, in the order of the modes given."""
        return [ep.url for ep in self.endpoints]


def main() -> None:
    """`python -m tests.standins.vllm_server MODE [MODE ...]`: serve, print the URLs (benchmark)."""
    import sys

    modes = sys.argv[1:] or ["healthy"]
    with StandInFleet(modes) as fleet:
        print(json.dumps(fleet.urls), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            sys.stdin.read()  # until the parent closes our stdin


if __name__ == "__main__":
    main()
