"""The one stand-in vLLM HTTP server every test and stand-in builds on.

:class:`StandInVllm` answers like a vLLM OpenAI server (/health, /version, /v1/models,
/metrics, 404 elsewhere); a stand-in changes only what differs by overriding
:meth:`StandInVllm.models`, :meth:`StandInVllm.metrics_text`, :meth:`StandInVllm.get`
or :meth:`StandInVllm.post`, or by setting the class attributes (``API_KEY``: /v1/...
needs the bearer key; ``DELAY``: every answer that late; ``HEALTH``: /health's code).
:func:`serving` runs a handler class on a free loopback port in a thread.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JSONHandler(BaseHTTPRequestHandler):
    """A quiet handler with JSON and text responders.

    A client that gave up (--timeout tests) is not an error.
    """

    def log_message(self, *a) -> None:
        """Keep the test output clean: no access log on stderr."""

    def _send(self, code: int, body: dict) -> None:
        self._send_bytes(code, json.dumps(body).encode(), "application/json")

    def _send_text(self, code: int, body: str, ctype: str = "text/plain") -> None:
        self._send_bytes(code, body.encode(), ctype)

    def _send_bytes(self, code: int, data: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):
            self.wfile.write(data)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:  # not JSON (a form, a bare word): the handler sees no fields
            return {}
        return body if isinstance(body, dict) else {}


class StandInVllm(JSONHandler):
    """A vLLM-like OpenAI server: override the parts a test needs, keep the rest.

    ``API_KEY`` set: like vLLM's AuthenticationMiddleware, /v1/... answers 401 without
    ``Authorization: Bearer <API_KEY>``; /health, /version and /metrics stay open.
    ``DELAY``: seconds every answer waits. ``HEALTH``: the /health status code.
    ``VERSION`` None: no /version (404).
    """

    API_KEY: str | None = None
    MODEL = "stand-in"
    VERSION: str | None = "0.0-standin"
    HEALTH = 200
    DELAY = 0.0

    def models(self) -> list[dict]:
        """The entries of /v1/models' ``data``."""
        return [{"id": self.MODEL, "root": None}]

    def metrics_text(self) -> str | None:
        """The /metrics body (None: /metrics is 404)."""
        return "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"

    def get(self, path: str) -> bool:
        """Answer a GET beyond the common endpoints; False: not served (404)."""
        return False

    def post(self, path: str, body: dict) -> bool:
        """Answer a POST with its JSON ``body``; False: not served (404)."""
        return False

    def refused(self) -> bool:
        """Answer 401 to a /v1 request without the bearer key (when API_KEY is set)."""
        if (
            self.API_KEY is not None
            and self.path.startswith("/v1")
            and self.headers.get("Authorization") != f"Bearer {self.API_KEY}"
        ):
            self._send(401, {"error": "Unauthorized"})
            return True
        return False

    def do_GET(self) -> None:
        """Serve /health, /version, /v1/models, /metrics, then :meth:`get`, else 404."""
        time.sleep(self.DELAY)
        path = self.path.split("?")[0]
        if self.refused():
            return
        if path == "/health":
            self._send(self.HEALTH, {})
        elif path == "/version" and self.VERSION is not None:
            self._send(200, {"version": self.VERSION})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": self.models()})
        elif path == "/metrics" and (metrics := self.metrics_text()) is not None:
            self._send_text(200, metrics)
        elif not self.get(path):
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        """Serve :meth:`post` with the request's JSON body, else 404."""
        time.sleep(self.DELAY)
        if not self.refused() and not self.post(self.path.split("?")[0], self._body()):
            self._send(404, {"detail": "Not Found"})


class GuardedHandler(StandInVllm):
    """A vLLM-like server started with ``--api-key`` that records every request.

    Every request's path and Authorization header is recorded in ``seen`` (a class
    attribute: give each test its own subclass).
    """

    API_KEY = "s3cret-key"
    seen: list[tuple[str, str | None]] = []

    def refused(self) -> bool:
        """Record the request, then refuse it as :class:`StandInVllm` does."""
        self.seen.append((self.path, self.headers.get("Authorization")))
        return super().refused()


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
