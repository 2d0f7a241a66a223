"""A stand-in vLLM 0.32 server with the admin routes, for the console's actions and
``runs bundle``: /health, /version, /v1/models, /metrics (the recorded real body) and,
only in dev mode (like VLLM_SERVER_DEV_MODE=1), /server_info, /reset_prefix_cache,
/sleep, /wake_up, /is_sleeping, /pause, /resume, /is_paused; anything else is vLLM's
404 ``{"detail": "Not Found"}``. Every request is recorded in ``calls`` as
(method, path with query).

``python -m tests.standin_admin [--dev] [--model NAME]`` serves on a free port in a
process of its own (the bundle test's "engine"), prints its URL, writes a vLLM-like
startup line holding its API key (as vLLM logs its non-default args), serves until
killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.standin import JSONHandler, serving

METRICS = (Path(__file__).parent / "data" / "vllm_metrics_tiny_llama.txt").read_text()
DEV_GET = {"/server_info", "/is_sleeping", "/is_paused"}
DEV_POST = {"/reset_prefix_cache", "/sleep", "/wake_up", "/pause", "/resume"}


def handler(dev: bool, model: str = "tiny-llama", root: str | None = None) -> type:
    """A fresh handler class (its own state) for one stand-in server."""

    class Admin(JSONHandler):
        DEV = dev
        calls: list[tuple[str, str]] = []
        state = {"sleeping": False, "paused": False, "level": 0}

        def _text(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            self.calls.append(("GET", self.path))
            st = self.state
            if path == "/health":
                self._send(200, {})
            elif path == "/version":
                self._send(200, {"version": "0.32.0"})
            elif path == "/v1/models":
                m = {"id": model, "object": "model", "root": root or model, "max_model_len": 256}
                self._send(200, {"object": "list", "data": [m]})
            elif path == "/metrics":
                self._text(200, METRICS)
            elif self.DEV and path == "/server_info":
                self._send(200, {"vllm_config": {"model": model}, "standin": True})
            elif self.DEV and path == "/is_sleeping":
                self._send(200, {"is_sleeping": st["sleeping"]})
            elif self.DEV and path == "/is_paused":
                self._send(200, {"is_paused": st["paused"]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            self.calls.append(("POST", self.path))
            st = self.state
            if not (self.DEV and path in DEV_POST):
                self._send(404, {"detail": "Not Found"})
            elif path == "/reset_prefix_cache":
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

    return Admin


@contextlib.contextmanager
def admin_server(dev: bool, model: str = "tiny-llama") -> Iterator[tuple[str, type]]:
    """(url, handler class) of a stand-in served in a thread."""
    h = handler(dev, model)
    with serving(h) as url:
        yield url, h


def main() -> None:
    dev = "--dev" in sys.argv
    model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "tiny-llama"
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler(dev, model))
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    key = os.environ.get("VLLM_API_KEY", "")
    print(f"INFO non-default args: {{'model': '{model}', 'api_key': ['{key}'], "
          "'tokenizer': '/models/tok', 'max_num_batched_tokens': 2048}", flush=True)  # fmt: skip
    print(f"DEBUG forwarding with Authorization: Bearer {key}", flush=True)
    print(json.dumps({"url": url}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        srv.serve_forever()


if __name__ == "__main__":
    main()
