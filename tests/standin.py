"""Shared base for the in-test stand-in HTTP servers that prove checks can fail."""

from __future__ import annotations

import contextlib
import json
from http.server import BaseHTTPRequestHandler


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
