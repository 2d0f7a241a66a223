"""opsctl.domain.alert_rules and `opsctl rules`, pure parts and bad input: the one
definition the console reads its windows from, durations, job quoting, the alerts
Prometheus answers mapped to endpoints, and the command's bad input (one line, exit 2,
nothing written)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.console.judge_state import Settings
from opsctl.console.render_advice import alerts_cell
from opsctl.console.view_drill_in import alert_lines
from opsctl.domain import alert_rules as ar


def test_the_console_reads_its_stall_window_and_restart_hold_from_the_rules():
    s = Settings()
    assert (s.stall_window_s, s.restart_hold_s) == (ar.STALL_WINDOW_S, ar.RESTART_HOLD_S)
    assert f"offset {ar.dur(ar.STALL_WINDOW_S)}" in ar.stall_expr("vllm")
    assert f"[{ar.dur(ar.STALL_WINDOW_S - 0.001)}]" in ar.stall_expr("vllm")


@pytest.mark.parametrize(
    "seconds, text",
    [(10, "10s"), (9.999, "9s999ms"), (0.25, "250ms"), (60, "1m"), (900, "15m"), (90, "90s")],
)
def test_durations(seconds, text):
    assert ar.dur(seconds) == text


def test_job_is_quoted_as_a_promql_string():
    assert ar.selector('a"b\\c') == '{job="a\\"b\\\\c"}'
    assert ar.selector(None) == ""


def test_every_alert_has_a_name_severity_summary_and_an_opsctl_runbook():
    doc = yaml.safe_load(ar.rules_yaml("vllm", 120))
    rules = {r["alert"]: r for r in doc["groups"][1]["rules"]}
    assert list(rules) == list(ar.ALERT_NAMES)
    assert len(set(ar.ALERT_NAMES)) == 9
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("critical", "warning"), name
        assert r["annotations"]["runbook"].startswith("opsctl "), name
    held = {n for n, r in rules.items() if "for" in r}
    assert held == set(ar.ALERT_NAMES) - {"VllmEngineRestarted", "VllmRestartLoop"}
    assert {rules[n]["for"] for n in held} == {"2m"}


ANSWER = {
    "alerts": [
        {"labels": {"alertname": "VllmTargetDown", "instance": "a:1", "job": "vllm",
                    "severity": "warning"}, "annotations": {"summary": "s1"},
         "state": "firing", "activeAt": "2026-12-03T05:00:00Z"},
        {"labels": {"alertname": "VllmEngineStalled", "instance": "a:1", "job": "vllm",
                    "severity": "critical"},
         "annotations": {"summary": "s2", "runbook": "opsctl console http://a:1"},
         "state": "firing", "activeAt": "2026-12-03T05:00:01Z"},
        {"labels": {"alertname": "VllmQueueBacklog", "instance": "a:1"}, "state": "pending"},
        {"labels": {"alertname": "Other", "instance": "b:1"}, "state": "firing"},
        {"labels": {"instance": "a:1"}},  # no name: not an alert
        "junk",
    ]
}  # fmt: skip


def test_alerts_are_mapped_by_instance_firing_only_most_severe_first():
    alerts = ar.parse_alerts(ANSWER)
    assert len(alerts) == 4
    mine = ar.firing_for(alerts, "a:1")
    assert [a.name for a in mine] == ["VllmEngineStalled", "VllmTargetDown"]
    assert alerts_cell(mine) == "ALERT VllmEngineStalled +1: "
    assert alerts_cell(()) == ""
    lines = alert_lines(mine)
    assert lines[0] == "alerts firing (2, from Prometheus)"
    assert "    next: opsctl console http://a:1" in lines
    assert mine[0].to_dict()["active_at"] == "2026-12-03T05:00:01Z"
    assert ar.firing_for(alerts, "c:1") == ()
    assert ar.parse_alerts({"alerts": None}) == [] and ar.parse_alerts([]) == []


@pytest.mark.parametrize(
    "args, words",
    [
        (["--for", "0"], "--for: must be more than zero"),
        (["--for", "-5s"], "--for"),
        (["--for", "soon"], "--for"),
        (["--job", " "], "--job takes a job label value"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, words):
    out = tmp_path / "rules.yml"
    r = CliRunner().invoke(app, ["rules", *args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert words in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_out_into_a_missing_directory_or_a_directory_is_bad_input(tmp_path):
    for target, words in ((tmp_path / "no" / "r.yml", "does not exist"), (tmp_path, "directory")):
        r = CliRunner().invoke(app, ["rules", "--out", str(target)])
        assert r.exit_code == 2 and words in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_stdout_without_out(tmp_path):
    r = CliRunner().invoke(app, ["rules", "--job", "prod-vllm", "--for", "30s"])
    assert r.exit_code == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    stalled = doc["groups"][1]["rules"][0]
    assert stalled["alert"] == "VllmEngineStalled" and stalled["for"] == "30s"
    assert 'job="prod-vllm"' in stalled["expr"]
