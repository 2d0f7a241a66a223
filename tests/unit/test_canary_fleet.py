"""The canary at fleet scale (issue 45 item 6), without an engine: `opsctl rules
--blackbox-out` writes a module the real blackbox exporter loads (``--config.check``) and
whose probe POSTs the console's own canary body; its scrape job passes `promtool check
config`; VllmCanaryFailed fires under `promtool test rules` for a failed or slow probe
only; the Prometheus source's probe reading (pure: canary_query, parse_probes, with_probe)
turns a ready endpoint whose probe got no answer into stalled, and nothing else. The
canary end to end (a real engine stopped while idle, a real exporter and Prometheus):
tests/e2e/test_console_prometheus_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors import canary as canary_collector
from opsctl.console import judge as c
from opsctl.console import judge_prom as prom
from opsctl.console import judge_prom_view as prom_view
from opsctl.domain import alert_rules as ar
from tests.blackbox_fixture import running_blackbox
from tests.prometheus_fixture import running_prometheus
from tests.standins.vllm_server import Endpoint
from tests.standins.vllm_server import answer as vllm_answer
from tests.unit.test_promtool_rules import PROMTOOL, promtool, promtool_test  # noqa: F401
from tests.waiting import wait_until


def rules(tmp, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "opsctl", "rules", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp)


class Completions:
    """An HTTP server that records what the probe POSTs and answers like vLLM; with
    ``stopped``, like a vLLM whose EngineCore was stopped while idle: /health 200, /metrics
    (a recorded vLLM body) at 0 running, and a completion that never returns."""

    def __init__(self, stopped: bool = False) -> None:
        self.seen: list[tuple[str, dict, str]] = []
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.wfile.write(vllm_answer(Endpoint("healthy"), self.path.split("?")[0]))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append((self.path, body, self.headers.get("Authorization", "")))
                if stopped:
                    outer.released.wait(120)
                    return
                out = b'{"choices":[{"text":"!","finish_reason":"length"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def test_the_blackbox_module_loads_in_the_real_exporter_and_probes_the_console_canary(tmp_path):
    (tmp_path / "key").write_text("sekrit")
    r = rules(tmp_path, "--job", "vllm", "--out", "rules.yml", "--blackbox-out", "blackbox.yml",
              "--canary-key-file", str(tmp_path / "key"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"job_name: {ar.CANARY_JOB}" in r.stderr  # the scrape job, shown where to put it
    text = (tmp_path / "blackbox.yml").read_text()
    assert "VllmCanaryFailed" in text.split("modules:")[0]  # the header says what reads it
    server = Completions()
    try:
        with running_blackbox(tmp_path / "blackbox.yml") as exporter:
            got = exporter.probe(f"{server.url}/v1/completions")
        assert got["probe_success"] == 1, got
        assert server.seen == [("/v1/completions", ar.CANARY_BODY, "Bearer sekrit")]
    finally:
        server.close()
    # the console's canary sends the same body (no "model": vLLM takes its first model)
    assert ar.CANARY_BODY["prompt"] == canary_collector.PROMPT


def test_the_canary_scrape_job_is_a_valid_prometheus_config(tmp_path, promtool):  # noqa: F811
    r = rules(tmp_path, "--job", "vllm", "--out", "rules.yml")
    assert r.returncode == 0, r.stderr
    doc = {"rule_files": ["rules.yml"],
           "scrape_configs": [ar.canary_scrape_job(["127.0.0.1:8000"], interval_s=15)]}  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(doc))
    r = subprocess.run([promtool, "check", "config", "prometheus.yml"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    job = doc["scrape_configs"][0]
    assert job["scrape_timeout"] == "11s"  # the module's 10 s plus the exporter's half second
    relabel = job["relabel_configs"]
    assert relabel[0]["replacement"] == "http://${1}/v1/completions"
    assert relabel[1] == {"source_labels": ["__address__"], "target_label": "instance"}


def probe_series(instance: str, success: list[int], seconds: list[float]) -> list[dict]:
    lab = f'job="{ar.CANARY_JOB}",instance="{instance}"'
    return [{"series": f"probe_success{{{lab}}}", "values": " ".join(map(str, success))},
            {"series": f"probe_duration_seconds{{{lab}}}",
             "values": " ".join(f"{s:g}" for s in seconds)}]  # fmt: skip


def expected(instance: str) -> dict:
    a = next(a for a in ar.alerts("vllm") if a.name == "VllmCanaryFailed")
    ann = {k: v.replace("{{ $labels.instance }}", instance)
           for k, v in {"summary": a.summary, "runbook": a.runbook}.items()}  # fmt: skip
    labels = {"severity": "critical", "source": "opsctl", "job": ar.CANARY_JOB,
              "instance": instance}  # fmt: skip
    return {"exp_labels": labels, "exp_annotations": ann}


def test_the_canary_alert_fires_for_failed_or_slow_probes_only(tmp_path, promtool):  # noqa: F811
    n = 20
    ok, fast = [1] * n, [0.05] * n
    inputs = [
        *probe_series("healthy:1", ok, fast),
        *probe_series("stopped:1", [1] * 5 + [0] * (n - 5), [0.05] * 5 + [9.5] * (n - 5)),
        *probe_series("slow:1", ok, [0.05] * 5 + [ar.CANARY_SLOW_S + 1] * (n - 5)),
        *probe_series("blip:1", [1] * 5 + [0] + [1] * (n - 6), fast),  # one failed probe
    ]
    at = [(4, []), (8, []), (12, ["slow:1", "stopped:1"]), (18, ["slow:1", "stopped:1"])]
    tests = [{"interval": "1s", "input_series": inputs, "alert_rule_test": [
        {"eval_time": f"{t}s", "alertname": "VllmCanaryFailed",
         "exp_alerts": [expected(i) for i in firing]} for t, firing in at]}]  # fmt: skip
    promtool_test(promtool, tmp_path, ar.rules_yaml("vllm", for_s=5), tests)


def answer(*items: tuple[str, str, float]) -> list[dict]:
    return [{"metric": {"instance": i, prom.TAG: tag}, "value": [1700000000.5, str(v)]}
            for i, tag, v in items]  # fmt: skip


def test_probes_parse_per_instance():
    q = prom.canary_query(ar.CANARY_JOB)
    assert 'probe_success{job="vllm-canary"}' in q and 'phase="connect"' in q
    got = prom.parse_probes(answer(
        ("a:1", "success", 0), ("a:1", "seconds", 2.5), ("a:1", "status", 0),
        ("a:1", "connect", 0.0001), ("b:1", "success", 1), ("c:1", "seconds", 1),
        ("d:1", "success", 0), ("d:1", "status", 0), ("d:1", "connect", 0)))  # fmt: skip
    assert got["a:1"] == prom.Probe("a:1", False, 2.5, 0, 1700000000.5, True)
    assert got["b:1"].success and "c:1" not in got  # no success sample: no probe
    assert not got["d:1"].connected


TARGET = c.Target("a:1", "http://a:1", "prometheus")


def view(state: str) -> c.EndpointView:
    return c.EndpointView(TARGET, state, "why", c.Figures(), c.EngineInfo(), None, 200,
                          None, None, 0, 0, None)  # fmt: skip


@pytest.mark.parametrize(
    "state, probe, after",
    [
        (c.READY, prom.Probe("a:1", False, 2.5, 0, None), c.STALLED),  # no answer in time
        (c.READY, prom.Probe("a:1", False, 0.1, 500, None), c.READY),  # an error: inconclusive
        (c.READY, prom.Probe("a:1", False, 0.0, 0, None, False), c.READY),  # refused
        (c.READY, prom.Probe("a:1", True, 0.05, 200, None), c.READY),
        (c.READY, None, c.READY),
        (c.BUSY, prom.Probe("a:1", False, 2.5, 0, None), c.BUSY),  # its gauges vouch for it
        (c.DEAD, prom.Probe("a:1", False, 2.5, 0, None), c.DEAD),
    ],
)
def test_a_ready_endpoint_whose_probe_got_no_answer_is_stalled(state, probe, after):
    got = prom_view.with_probe(view(state), probe, ar.CANARY_JOB)
    assert got.state == after
    if after == c.STALLED:
        assert "blackbox canary (vllm-canary) got no 1-token completion within 2.5 s" in got.reason


@pytest.mark.parametrize(
    "args, says",
    [
        (["--canary-key-file", "k"], "--canary-key-file goes with --blackbox-out FILE"),
        (["--blackbox-out", "."], "--blackbox-out . is a directory"),
        (["--out", "x.yml", "--blackbox-out", "x.yml"], "name the same file"),
        (["--blackbox-out", "nowhere/b.yml"], "directory nowhere does not exist"),
    ],
)
def test_bad_canary_options_are_one_line_exit_2_nothing_written(tmp_path, args, says):
    r = rules(tmp_path, *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def console_once(prom_url: str) -> tuple[int, dict[str, dict]]:
    argv = ["console", "--prometheus", prom_url, "--job", "vllm", "--once", "--json",
            "--interval", "0.5s", "--canary-timeout", "2s"]  # fmt: skip
    r = CliRunner().invoke(app, argv)
    doc = json.loads(r.stdout)
    return r.exit_code, {e["url"]: e for e in doc["endpoints"]}


def test_a_server_stopped_while_idle_behind_prometheus_is_not_ready(tmp_path):
    """Stand-ins for the e2e's case (fast, in the unit tier): a server whose completions
    hang while /health says 200 and its gauges 0 running. Over a Prometheus with the canary
    job, the probes make it stalled and VllmCanaryFailed fires for it alone; over one
    without, console --once's own canary does. (On main both said ready, exit 0.)"""
    r = rules(tmp_path, "--job", "vllm", "--for", "1s", "--out", "rules.yml",
              "--blackbox-out", "blackbox.yml")  # fmt: skip
    assert r.returncode == 0, r.stderr
    ok, stopped = Completions(), Completions(stopped=True)
    urls = [ok.url, stopped.url]
    try:
        with (
            running_blackbox(tmp_path / "blackbox.yml") as exporter,
            running_prometheus(urls, rule_files=[str(tmp_path / "rules.yml")],
                               canary=exporter.address, canary_interval=2.0) as prom,
            running_prometheus(urls) as plain,
        ):  # fmt: skip

            def firing() -> dict:
                return {a["labels"]["instance"]: a for a in prom.alerts()
                        if a["labels"]["alertname"] == "VllmCanaryFailed"
                        and a["state"] == "firing"}  # fmt: skip

            wait_until(lambda: set(firing()) == {stopped.url.split("//")[1]}, 60,
                       "VllmCanaryFailed firing for the stopped server", prom.alerts)  # fmt: skip
            code, rows = console_once(prom.url)
            assert rows[stopped.url]["state"] == "stalled", rows[stopped.url]
            assert (
                "blackbox canary (vllm-canary) got no 1-token completion"
                in (rows[stopped.url]["reason"])
            )
            assert rows[ok.url]["state"] == "ready" and code == 1, rows[ok.url]
            code, rows = console_once(plain.url)
            assert rows[stopped.url]["state"] == "stalled", rows[stopped.url]
            assert "did not return within 2 s" in rows[stopped.url]["reason"]
            assert rows[ok.url]["state"] == "ready" and code == 1
    finally:
        ok.close()
        stopped.close()
