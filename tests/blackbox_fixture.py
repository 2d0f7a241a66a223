"""A real Prometheus blackbox exporter (Debian's `prometheus-blackbox-exporter`,
/usr/bin/prometheus-blackbox-exporter; `make prometheus` installs it as root) running the
canary module `opsctl rules --blackbox-out` writes.

``running_blackbox(config)`` starts the exporter on a free 127.0.0.1 port with that
blackbox.yml, waits (deadline) until it answers, and stops it on exit (terminate, then
kill; the process is gone when the context exits). ``BlackboxServer.probe(target)`` asks
it for one probe, as Prometheus's scrape job does. It FAILS, never skips, when the
exporter is missing: a CI that runs these tests must have it."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from opsctl.domain.alert_rules import CANARY_MODULE
from tests.prometheus_fixture import LogTail, _stop, find_binary, start_on_free_port

MISSING = (
    "the blackbox exporter is not installed ({binary} missing): run `make prometheus` as "
    "root (apt-get install -y prometheus-blackbox-exporter) or set OPSCTL_BLACKBOX"
)


def binary() -> str:
    """The exporter's binary, or a test failure saying how to install it."""
    return find_binary(
        "OPSCTL_BLACKBOX", "/usr/bin/prometheus-blackbox-exporter", "blackbox_exporter", MISSING
    )


@dataclass
class BlackboxServer(LogTail):
    proc: subprocess.Popen
    url: str
    log_path: Path

    @property
    def address(self) -> str:
        """host:port, as a scrape job's __address__ replacement names it."""
        return self.url.split("//", 1)[1]

    def probe(self, target: str, timeout: float = 30.0) -> dict[str, float]:
        """One probe of ``target`` (a full URL) with the canary module: its probe_* samples."""
        params = {"module": CANARY_MODULE, "target": target}
        r = httpx.get(f"{self.url}/probe", params=params, timeout=timeout)
        r.raise_for_status()
        out = {}
        for line in r.text.splitlines():
            if line.startswith("probe_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


@contextlib.contextmanager
def running_blackbox(config: Path) -> Iterator[BlackboxServer]:
    """The exporter with ``config`` (blackbox.yml) on a free 127.0.0.1 port."""
    exe = binary()
    check = subprocess.run([exe, f"--config.file={config}", "--config.check"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    with tempfile.TemporaryDirectory(prefix="opsctl-blackbox-") as tmp:
        log_path = Path(tmp) / "blackbox.log"
        proc, url = start_on_free_port(
            "blackbox exporter",
            lambda port: [exe, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}"],
            log_path,
            Path(tmp),
            60.0,
        )
        try:
            yield BlackboxServer(proc, url, log_path)
        finally:
            _stop(proc)
            assert proc.poll() is not None, "blackbox exporter still running"
