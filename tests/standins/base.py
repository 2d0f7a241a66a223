"""Shared base for the in-test stand-in HTTP servers that prove checks can fail."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JSONHandler(BaseHTTPRequestHandler):
    """Quiet handler with a JSON responder; a client that gave up (--timeout tests) is
    not an error."""

    def log_message(self, *a) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):
            self.wfile.write(data)


class GuardedHandler(JSONHandler):
    """A vLLM-like server started with ``--api-key``: like vLLM's AuthenticationMiddleware,
    /v1/... answers 401 without ``Authorization: Bearer <API_KEY>``; /health, /version
    and /metrics stay open. Every request's path and Authorization header is recorded
    in ``seen`` (a class attribute: give each test its own subclass)."""

    API_KEY = "s3cret-key"
    MODEL = "stand-in"
    seen: list[tuple[str, str | None]] = []

    def _guarded(self) -> bool:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v1") and (
            self.headers.get("Authorization") != f"Bearer {self.API_KEY}"
        ):
            self._send(401, {"error": "Unauthorized"})
            return True
        return False

    def do_GET(self) -> None:
        if self._guarded():
            return
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/version":
            self._send(200, {"version": "0.0-standin"})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": self.MODEL, "root": None}]})
        elif self.path == "/metrics":
            data = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self._guarded():
            return
        self._send(404, {"detail": "Not Found"})


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Run ``handler`` on a free loopback port in a thread; yields the base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
