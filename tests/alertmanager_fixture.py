"""A real Alertmanager (Debian's `prometheus-alertmanager`, /usr/bin/prometheus-alertmanager)
routing every alert to a webhook receiver inside the test.

``Webhook()`` is a tiny HTTP server on 127.0.0.1 that keeps every notification Alertmanager
posts (the webhook JSON: status, alerts with labels, startsAt/endsAt), with the time it
arrived. ``running_alertmanager(webhook_url)`` writes a minimal alertmanager.yml (one route,
no grouping delays worth waiting for, resolved notifications on), starts Alertmanager on a
free 127.0.0.1 port with a temporary storage dir and no cluster listener, waits (deadline)
until it is ready, and stops it on exit (terminate, then kill).

docs/fleets.md shows the same route with production delays; its own file is started by
tests/unit/test_fleets_doc.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.prometheus_fixture import LogTail, _stop, find_binary, start_on_free_port

MISSING = (
    "Alertmanager is not installed ({binary} missing): run `make prometheus` as root "
    "(apt-get install -y prometheus-alertmanager) or set OPSCTL_ALERTMANAGER"
)


def binary() -> str:
    return find_binary(
        "OPSCTL_ALERTMANAGER", "/usr/bin/prometheus-alertmanager", "alertmanager", MISSING
    )


@dataclass(frozen=True, slots=True)
class Notification:
    received_at: float  # time.time() when the receiver got it
    body: dict

    def alerts(self, status: str | None = None) -> list[dict]:
        return [a for a in self.body.get("alerts", []) if status in (None, a.get("status"))]


class Webhook:
    """The receiver: every POST body (JSON) kept as a Notification."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    outer.notifications.append(Notification(time.time(), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def received(self, alertname: str, status: str, **labels: str) -> list[tuple[float, dict]]:
        """(arrival time, alert) of every notified alert with this name, status and labels."""
        with self._lock:
            notes = list(self.notifications)
        return [
            (n.received_at, a)
            for n in notes
            for a in n.alerts(status)
            if a["labels"].get("alertname") == alertname
            and all(a["labels"].get(k) == v for k, v in labels.items())
        ]


def config_text(webhook_url: str) -> str:
    """alertmanager.yml: every alert to the webhook, notified a second after it arrives,
    resolved ones too (docs/fleets.md's example with the test's receiver URL)."""
    return (
        "route:\n"
        "  receiver: opsctl-webhook\n"
        "  group_by: [alertname, instance]\n"
        "  group_wait: 1s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: opsctl-webhook\n"
        "    webhook_configs:\n"
        f"      - url: {webhook_url}\n"
        "        send_resolved: true\n"
    )


@dataclass
class AmServer(LogTail):
    proc: subprocess.Popen
    url: str
    log_path: Path

    def alerts(self) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v2/alerts", timeout=10)
        r.raise_for_status()
        return r.json()


@contextlib.contextmanager
def running_alertmanager(webhook_url: str, timeout: float = 60.0) -> Iterator[AmServer]:
    exe = binary()
    with tempfile.TemporaryDirectory(prefix="opsctl-am-") as tmp:
        workdir = Path(tmp)
        config = workdir / "alertmanager.yml"
        config.write_text(config_text(webhook_url))
        log_path = workdir / "alertmanager.log"
        proc, url = start_on_free_port(
            "alertmanager",
            lambda port: [
                exe,
                f"--config.file={config}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            log_path,
            workdir,
            timeout,
        )
        try:
            yield AmServer(proc, url, log_path)
        finally:
            _stop(proc)
            assert proc.poll() is not None, "alertmanager still running"
