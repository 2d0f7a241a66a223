"""A real Prometheus server for the console's tests and benchmark (Debian's `prometheus`
package, /usr/bin/prometheus; `make prometheus` installs it as root).

``running_prometheus(urls)`` writes a config scraping the given vLLM base URLs in two
jobs, ``vllm`` (/metrics) and ``vllm-health`` (/health: vLLM answers an empty 200, which
Prometheus reads as a good scrape with no samples, and a 503 as up=0 with the status in
the target's lastError), starts Prometheus on a free 127.0.0.1 port with a temporary
storage dir, waits (deadline) until every target has been scraped (``up=True``: until
every metrics target is up), and stops it on exit (terminate, then kill; the process is
gone when the context exits).

The pytest fixture ``prometheus`` is a factory over the same context manager: import it
into a test module (``from tests.prometheus_fixture import prometheus``). It FAILS, never
skips, when Prometheus is missing: a CI that runs these tests must have it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from opsctl.engine.server import free_port

MISSING = (
    "Prometheus is not installed ({binary} missing): run `make prometheus` as root "
    "(apt-get install -y prometheus) or set OPSCTL_PROMETHEUS to a prometheus binary"
)
JOB, HEALTH_JOB = "vllm", "vllm-health"


class LogTail:
    """A server process whose output goes to ``log_path``."""

    log_path: Path

    def log_text(self) -> str:
        """The log's last 3000 characters ("" when it cannot be read): for a failure message."""
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


@dataclass
class PromServer(LogTail):
    proc: subprocess.Popen
    url: str
    config_path: Path
    log_path: Path
    job: str = JOB

    def targets(self) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["activeTargets"]

    def alerts(self) -> list[dict]:
        """Prometheus's active alerts (pending and firing)."""
        r = httpx.get(f"{self.url}/api/v1/alerts", timeout=10)
        r.raise_for_status()
        return r.json()["data"]["alerts"]


def find_binary(env: str, default: str, name: str, missing: str) -> str:
    """$``env`` (else ``default``) when executable, else ``name`` on PATH, else a test
    failure (``missing``)."""
    path = os.environ.get(env, default)
    found = path if os.access(path, os.X_OK) else shutil.which(name)
    if not found:
        pytest.fail(missing.format(binary=path), pytrace=False)
    return found


def binary() -> str:
    """The prometheus binary, or a test failure saying how to install it."""
    return find_binary("OPSCTL_PROMETHEUS", "/usr/bin/prometheus", "prometheus", MISSING)


def _hostports(urls: list[str]) -> list[str]:
    return [urlsplit(u).netloc for u in urls]


def config_text(
    urls: list[str],
    interval: float,
    job: str = JOB,
    health: bool = True,
    rule_files: list[str] | None = None,
    alertmanager: str | None = None,
    canary: str | None = None,
    canary_interval: float = 3.0,
) -> str:
    """Prometheus YAML (JSON is YAML) for the vLLM servers at ``urls``; ``rule_files`` are
    loaded (evaluated every ``interval``), alerts go to the Alertmanager at ``alertmanager``
    (a base URL); ``canary``: the blackbox exporter (host:port) that probes every server
    every ``canary_interval`` in opsctl's canary scrape job (alert_rules.canary_scrape_job)."""
    import json

    ms = f"{max(1, int(interval * 1000))}ms"
    timeout = f"{max(1, int(min(interval, 10.0) * 1000))}ms"
    static = [{"targets": _hostports(urls)}]
    jobs = [{"job_name": job, "metrics_path": "/metrics", "static_configs": static}]
    if health:
        jobs.append({"job_name": HEALTH_JOB, "metrics_path": "/health", "static_configs": static})
    if canary:
        from opsctl.domain.alert_rules import canary_scrape_job

        jobs.append(canary_scrape_job(_hostports(urls), canary, canary_interval))
    doc = {
        "global": {"scrape_interval": ms, "scrape_timeout": timeout, "evaluation_interval": ms},
        "scrape_configs": jobs,
    }
    if rule_files:
        doc["rule_files"] = list(rule_files)
    if alertmanager:
        am = [{"static_configs": [{"targets": [urlsplit(alertmanager).netloc]}]}]
        doc["alerting"] = {"alertmanagers": am}
    return json.dumps(doc, indent=1)


def start_on_free_port(
    what: str, cmd_for: Callable[[int], list[str]], log_path: Path, cwd: Path, timeout: float
) -> tuple[subprocess.Popen, str]:
    """Start ``cmd_for(port)`` on a free 127.0.0.1 port until it answers /-/ready (3 tries)."""
    for _ in range(3):  # a free port may be taken between the probe and the bind
        port = free_port()
        with log_path.open("ab") as log:
            proc = subprocess.Popen(cmd_for(port), stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        url = f"http://127.0.0.1:{port}"
        if _wait_ready(proc, url, timeout):
            return proc, url
        _stop(proc)
    raise RuntimeError(f"{what} did not start: {log_path.read_text(errors='replace')[-2000:]}")


def _start(workdir: Path, config: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    exe = binary()
    return start_on_free_port(
        "prometheus",
        lambda port: [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        log_path,
        workdir,
        60.0,
    )


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return True
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_scraped(server: PromServer, n: int, timeout: float, up: bool = False) -> list[dict]:
    """Until ``n`` active targets have been scraped (all metrics targets up, with ``up``)."""
    deadline = time.monotonic() + timeout
    targets: list[dict] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            targets = server.targets()
            scraped = [t for t in targets if t["health"] != "unknown"]
            metrics = [t for t in targets if t["labels"].get("job") == server.job]
            if len(scraped) >= n and (not up or all(t["health"] == "up" for t in metrics)):
                return targets
        time.sleep(0.2)
    states = {t["scrapeUrl"]: (t["health"], t.get("lastError")) for t in targets}
    raise AssertionError(f"prometheus targets not scraped in {timeout:g} s: {states}")


@contextlib.contextmanager
def running_prometheus(
    urls: list[str],
    *,
    interval: float = 1.0,
    job: str = JOB,
    health: bool = True,
    up: bool = False,
    timeout: float = 120.0,
    rule_files: list[str] | None = None,
    alertmanager: str | None = None,
    canary: str | None = None,
    canary_interval: float = 3.0,
) -> Iterator[PromServer]:
    """``rule_files`` (paths) are loaded and must load (checked through /api/v1/rules);
    firing alerts are sent to the Alertmanager at ``alertmanager`` (tests/alertmanager_fixture);
    ``canary``: a blackbox exporter's host:port (tests/blackbox_fixture) probing each server."""
    with tempfile.TemporaryDirectory(prefix="opsctl-prom-") as tmp:
        workdir = Path(tmp)
        config = workdir / "prometheus.yml"
        config.write_text(
            config_text(urls, interval, job, health, rule_files, alertmanager, canary,
                        canary_interval)
        )  # fmt: skip
        log_path = workdir / "prometheus.log"
        proc, url = _start(workdir, config, log_path)
        server = PromServer(proc, url, config, log_path, job)
        try:
            n = len(urls) * (1 + bool(health) + bool(canary))
            wait_scraped(server, n, timeout, up=up)
            if rule_files:
                r = httpx.get(f"{url}/api/v1/rules", timeout=10)
                groups = r.json()["data"]["groups"]
                assert groups, f"no rule group loaded: {server.log_text()}"
            yield server
        finally:
            _stop(proc)
            assert proc.poll() is not None, "prometheus still running"


@pytest.fixture
def prometheus() -> Iterator[Callable[..., PromServer]]:
    """Factory: ``prometheus(urls, interval=1.0, up=False)`` -> a running PromServer;
    every server it started is stopped at teardown."""
    binary()  # fail at setup, with the install hint, when Prometheus is missing
    with contextlib.ExitStack() as stack:

        def start(urls: list[str], **kw) -> PromServer:
            return stack.enter_context(running_prometheus(urls, **kw))

        yield start


# ---- recorded API answers for the unit tests (tests/data/prom_*.json) --------------------------

RECORD_MODES = ("healthy", "busy", "stalled", "dead", "hung", "unauthorized", "notvllm", "busy")


def record(out_dir: Path, stall_window: float = 3.0) -> None:
    """Record real answers of Prometheus scraping stand-ins in every mode (the last one
    restarted a moment before): `python -m tests.prometheus_fixture`."""
    import json

    from opsctl.console import judge_prom as prom
    from opsctl.console import judge_prom_view as prom_view
    from opsctl.console.judge_state import Settings
    from tests.standins.vllm_server import StandInFleet

    settings = Settings(interval_s=1.0, stall_window_s=stall_window)
    w = prom_view.windows(settings, 1.0)
    with StandInFleet(list(RECORD_MODES)) as fleet, running_prometheus(fleet.urls) as p:
        time.sleep(stall_window + 3)  # history covers the stall window
        fleet.reset_counters(len(RECORD_MODES) - 1)
        time.sleep(2.5)  # two scrapes after the reset
        api = f"{p.url}/api/v1"
        latency = " or ".join(f"({q})" for q in prom.latency_queries(JOB, w))  # one file
        answers = {
            "targets": httpx.get(f"{api}/targets", params={"state": "active"}),
            "query": httpx.post(f"{api}/query", data={"query": prom.figures_query(JOB, w)}),
            "latency": httpx.post(f"{api}/query", data={"query": latency}),
            "stall": httpx.post(f"{api}/query", data={"query": prom.stall_query(JOB, w)}),
            "query_all": httpx.post(f"{api}/query", data={"query": prom.figures_query(None, w)}),
            "error": httpx.post(f"{api}/query", data={"query": "rate(up)"}),
        }
        modes = {ep.url: ep.mode for ep in fleet.endpoints}
        modes[fleet.endpoints[-1].url] = "restarted"
    for name, r in answers.items():
        (out_dir / f"prom_{name}.json").write_text(json.dumps(r.json(), indent=1) + "\n")
    fleet_doc = {"job": JOB, "stall_window_s": stall_window, "modes": modes}
    (out_dir / "prom_fleet.json").write_text(json.dumps(fleet_doc, indent=1) + "\n")


if __name__ == "__main__":
    record(Path(__file__).parent / "data")


# ---- what Prometheus stored, scrape by scrape -------------------------------------------------


def raw_history(
    server: PromServer, instance: str, metrics: tuple[str, ...], seconds: float
) -> dict[float, tuple | None]:
    """Every scrape of ``instance`` (host:port) in the job over the last ``seconds``: scrape
    time -> the ``metrics`` (each summed over its series) it stored, or None where the scrape
    failed (``up`` 0). Raw samples (range selectors), not what a query would interpolate."""
    sel = f'{{job="{server.job}",instance="{instance}"}}[{max(1, round(seconds))}s]'

    def samples(name: str) -> dict[float, float]:
        r = httpx.get(f"{server.url}/api/v1/query", params={"query": name + sel}, timeout=30)
        r.raise_for_status()
        out: dict[float, float] = {}
        for series in r.json()["data"]["result"]:
            for t, v in series["values"]:
                out[float(t)] = out.get(float(t), 0.0) + float(v)
        return out

    up = samples("up")
    values = [samples(m) for m in metrics]
    hist: dict[float, tuple | None] = {}
    for t in sorted(up):
        row = tuple(v.get(t) for v in values)
        hist[t] = row if up[t] == 1 and None not in row else None
    return hist
