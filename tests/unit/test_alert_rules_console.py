"""The console shows Prometheus's firing alerts (issue 27 item 3) with the real parts: a
real Prometheus (Debian's package) scraping stand-in vLLM endpoints and loading the rules
`opsctl rules --job vllm` writes plus one test rule that fires on ``up`` of the /health job
(a stand-in whose /health says 503). The alert reaches that endpoint's row and drill-in
and the `console --once --json` document (console/4 ``alerts``), and no other row."""

from __future__ import annotations

import time

from opsctl.console.judge_state import Settings
from opsctl.console.prometheus import PrometheusSource
from opsctl.console.report import document
from opsctl.console.view_detail import summary_text
from opsctl.console.view_panel import row_cells
from opsctl.domain.alert_rules import rules_yaml
from tests.prometheus_fixture import prometheus  # noqa: F401 (the fixture)
from tests.standins.vllm_server import StandInFleet
from tests.waiting import wait_until

TEST_RULE = """groups:
- name: opsctl-test
  rules:
  - alert: OpsctlTestHealthDown
    expr: up{job="vllm-health"} == 0
    labels: {severity: critical}
    annotations:
      summary: "{{ $labels.instance }}: /health is failing"
      runbook: "opsctl status http://{{ $labels.instance }}"
"""


def firing(server) -> set[str]:
    return {a["labels"]["instance"] for a in server.alerts() if a["state"] == "firing"}


def test_firing_alerts_reach_the_endpoints_row_drill_in_and_json(prometheus, tmp_path):  # noqa: F811
    rules = tmp_path / "opsctl.yml"
    rules.write_text(rules_yaml("vllm"))  # what `opsctl rules --job vllm` writes
    (tmp_path / "test.yml").write_text(TEST_RULE)
    with StandInFleet(["healthy", "dead"]) as fleet:
        healthy, dead = fleet.urls
        server = prometheus(fleet.urls, interval=0.5, up=True,
                            rule_files=[str(rules), str(tmp_path / "test.yml")])  # fmt: skip
        inst = dead.split("//", 1)[1]
        wait_until(lambda: firing(server) == {inst}, 30, "the test alert firing", server.alerts)

        src = PrometheusSource(server.url, job="vllm", settings=Settings(interval_s=0.5))
        src.start()
        try:
            views = wait_until(
                lambda: (vs := {v.target.url: v for v in src.collect().endpoints})
                and vs.get(dead) is not None and vs[dead].alerts and vs,
                30, "the alert on the console's row",
            )  # fmt: skip
            snap = src.collect()
        finally:
            src.close()
        (alert,) = views[dead].alerts
        assert (alert.name, alert.severity, alert.state) == ("OpsctlTestHealthDown", "critical",
                                                             "firing")  # fmt: skip
        assert views[healthy].alerts == ()
        cells = row_cells(views[dead], time.time(), 0.5)
        assert cells[-1].startswith("ALERT OpsctlTestHealthDown: ")
        assert not row_cells(views[healthy], time.time(), 0.5)[-1].startswith("ALERT")
        detail = summary_text(views[dead], time.time(), 0.5).plain
        assert "alerts firing (1, from Prometheus)" in detail
        assert f"next: opsctl status http://{inst}" in detail

        doc = document(snap)  # what `console --once --json` prints (console/4)
        rows = {e["url"]: e for e in doc["endpoints"]}
        assert rows[healthy]["alerts"] == []
        assert rows[dead]["alerts"] == [{
            "alertname": "OpsctlTestHealthDown", "state": "firing", "severity": "critical",
            "summary": f"{inst}: /health is failing", "runbook": f"opsctl status http://{inst}",
            "active_at": rows[dead]["alerts"][0]["active_at"], "job": "vllm-health",
        }]  # fmt: skip
        assert rows[dead]["alerts"][0]["active_at"]
