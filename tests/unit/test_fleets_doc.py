"""docs/fleets.md (the fleet guide, up to its certify part) runs: its shell commands (`opsctl rules ...
--blackbox-out blackbox.yml`, `promtool check rules ...`, the blackbox exporter's
`--config.check`) in a temporary directory, its prometheus.yml through `promtool check
config` (which loads the rules file it names; its canary job is the one `opsctl rules`
prints) and its alertmanager.yml through `amtool check-config`; then a real Prometheus, a
real Alertmanager and a real blackbox exporter start from those files (addresses moved
to free 127.0.0.1 ports, the scrape targets to stand-in vLLM servers): Prometheus loads
every opsctl rule, finds the Alertmanager, scrapes the stand-ins and has the exporter
probe them; the console command the guide shows reads them. The alert paths
themselves (stall and canary -> firing) are tests/e2e/test_console_prometheus_e2e.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.domain.alert_rules import CANARY_JOB, canary_scrape_job
from opsctl.engine.server import free_port
from tests.alertmanager_fixture import Webhook
from tests.alertmanager_fixture import binary as am_binary
from tests.blackbox_fixture import running_blackbox
from tests.conftest import OPSCTL
from tests.prometheus_fixture import _stop, _wait_ready
from tests.prometheus_fixture import binary as prom_binary
from tests.standins.vllm_server import StandInFleet
from tests.waiting import wait_until

FLEETS = Path(__file__).resolve().parents[2] / "docs" / "fleets.md"
PROMTOOL = "/usr/bin/promtool"
AMTOOL = "/usr/bin/amtool"


def section() -> str:
    text = FLEETS.read_text(encoding="utf-8")
    return text.split("\n## Certify a fleet in CI\n", 1)[0]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if cmd[0] == "opsctl":
        cmd = [*OPSCTL, *cmd[1:]]
    elif cmd[0] in ("promtool", "amtool", "prometheus-blackbox-exporter"):
        cmd = [f"/usr/bin/{cmd[0]}", *cmd[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)


def configs() -> tuple[dict, dict]:
    docs = [yaml.safe_load(b) for b in blocks("yaml")]
    prom = next(d for d in docs if "scrape_configs" in d)
    am = next(d for d in docs if "route" in d)
    return prom, am


def test_the_sections_commands_and_configs_check(tmp_path):
    bash = blocks("bash")
    assert bash, "no bash block in docs/fleets.md"
    rules_cmds = [shlex.split(line) for line in bash[0].splitlines() if line.strip()]
    assert [c[:2] for c in rules_cmds] == [["opsctl", "rules"], ["promtool", "check"],
                                           ["prometheus-blackbox-exporter", "--config.file=blackbox.yml"]]  # fmt: skip
    outs = []
    for cmd in rules_cmds:
        r = run(cmd, tmp_path)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        outs.append(r)
    assert "SUCCESS: 13 rules found" in outs[1].stdout
    assert "Config file is ok" in outs[2].stdout + outs[2].stderr
    prom, am = configs()
    # the canary job is the one `opsctl rules --blackbox-out` prints (one definition)
    canary = next(j for j in prom["scrape_configs"] if j["job_name"] == CANARY_JOB)
    hosts = canary["static_configs"][0]["targets"]
    assert canary == canary_scrape_job(hosts), canary
    assert f"job_name: {CANARY_JOB}" in outs[0].stderr
    assert prom["rule_files"] == ["opsctl-rules.yml"]  # the file the command wrote
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    r = run(["promtool", "check", "config", "prometheus.yml"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 13 rules found" in r.stdout  # check config loaded the rules file too
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am))
    r = run(["amtool", "check-config", "alertmanager.yml"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    console = [shlex.split(line) for b in bash[1:] for line in b.splitlines() if line.strip()]
    assert console == [["opsctl", "console", "--prometheus", "http://127.0.0.1:9090",
                        "--job", "vllm"]]  # fmt: skip


def test_prometheus_and_alertmanager_start_from_the_sections_files(tmp_path):
    prom, am = configs()
    r = run(["opsctl", "rules", "--job", "vllm", "--out", "opsctl-rules.yml",
             "--blackbox-out", "blackbox.yml"], tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    procs = []
    with (
        Webhook() as hook,
        StandInFleet(["healthy", "busy"]) as fleet,
        running_blackbox(tmp_path / "blackbox.yml") as exporter,
    ):
        try:
            am_port, prom_port = free_port(), free_port()
            receiver = am["receivers"][0]["webhook_configs"][0]
            assert receiver["send_resolved"] is True
            receiver["url"] = hook.url
            (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am))
            am_cmd = [am_binary(), "--config.file=alertmanager.yml",
                      f"--storage.path={tmp_path / 'am'}",
                      f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="]  # fmt: skip
            log = (tmp_path / "am.log").open("ab")
            procs.append(subprocess.Popen(am_cmd, stdout=log, stderr=log, cwd=tmp_path))
            am_url = f"http://127.0.0.1:{am_port}"
            assert _wait_ready(procs[-1], am_url, 30), (tmp_path / "am.log").read_text()

            hosts = [u.split("//", 1)[1] for u in fleet.urls]
            prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [
                f"127.0.0.1:{am_port}"
            ]
            for job in prom["scrape_configs"]:
                job["static_configs"][0]["targets"] = hosts
                if job["job_name"] == CANARY_JOB:  # the exporter's port, not 9115
                    job["relabel_configs"][-1]["replacement"] = exporter.address
                    job["scrape_interval"] = job["scrape_timeout"] = "1s"
            # scrapes every second: the console's --once waits for two (docs/fleets.md's 5 s
            # would make this test wait 10 s for nothing it checks)
            prom["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
            prom_cmd = [prom_binary(), "--config.file=prometheus.yml",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}"]  # fmt: skip
            log = (tmp_path / "prom.log").open("ab")
            procs.append(subprocess.Popen(prom_cmd, stdout=log, stderr=log, cwd=tmp_path))
            url = f"http://127.0.0.1:{prom_port}"
            assert _wait_ready(procs[-1], url, 30), (tmp_path / "prom.log").read_text()

            groups = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
            loaded = {r["name"] for g in groups for r in g["rules"]}
            assert {"VllmEngineStalled", "VllmCanaryFailed"} <= loaded and len(loaded) == 13

            def scraped() -> bool:
                r = httpx.get(f"{url}/api/v1/targets", timeout=10).json()
                found = r["data"]["activeTargets"]
                return len(found) == 6 and all(t["health"] == "up" for t in found
                                               if t["labels"]["job"] != "vllm-health")  # fmt: skip

            wait_until(scraped, 30, "the three jobs' targets scraped (the exporter answered)")
            # the probes reached the stand-ins, labelled by their host:port (they answer
            # /v1/completions 404: the canary fails there, inconclusive for the console)
            q = {"query": f'probe_http_status_code{{job="{CANARY_JOB}"}}'}
            got = httpx.get(f"{url}/api/v1/query", params=q, timeout=10).json()["data"]["result"]
            assert {(x["metric"]["instance"], x["value"][1]) for x in got} == {
                (h, "404") for h in hosts
            }, got
            argv = ["console", "--prometheus", url, "--job", "vllm", "--once", "--json"]
            out = CliRunner().invoke(app, argv)  # the section's command, in-process
            doc = json.loads(out.stdout)
            states = {e["url"]: (e["state"], e["alerts"]) for e in doc["endpoints"]}
            assert states == {fleet.urls[0]: ("ready", []), fleet.urls[1]: ("busy", [])}, out.stderr
            wait_until(
                lambda: httpx.get(f"{url}/api/v1/alertmanagers", timeout=10).json()["data"][
                    "activeAlertmanagers"
                ],
                30, "Prometheus found the Alertmanager (its discovery updates every 5 s)",
            )  # fmt: skip
        finally:
            for p in reversed(procs):
                _stop(p)
    assert all(p.poll() is not None for p in procs)
    assert os.path.exists(tmp_path / "opsctl-rules.yml")
