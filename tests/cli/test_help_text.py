"""What a new user met in the help and the plain output (issue 36 item 8): no Python
types in help (``URL <list[str]>``, ``--api-key <str>``), no ``[default: (5m)]``, every
command's summary a capitalised sentence, ``version``'s keys aligned, ``status`` figures
written for people (``1,048,576``, not ``1.04858e+06``), an unreachable URL said once,
``runs list``'s pid column explained, the stall alert's window in readable units."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from tests.cli.test_grammar import leaves, walk

runner = CliRunner()
NAMES = sorted({" ".join(p) for p, _ in walk() if p})
PY_TYPE = re.compile(r"<(str|int|float|bool|path|list\[[a-z]+\])>")


@pytest.mark.parametrize("name", NAMES)
def test_help_names_values_not_python_types(name):
    r = runner.invoke(app, [*name.split(), "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    assert not PY_TYPE.search(r.output), PY_TYPE.search(r.output).group(0)
    assert "default: (" not in r.output.replace("\n", " ")


def test_every_summary_is_a_capitalised_sentence():
    r = runner.invoke(app, ["--help"], terminal_width=120)
    block = r.output.split("Commands:")[1].split("Examples:")[0]
    summaries = [line.split(None, 1)[1] for line in block.splitlines() if line.strip()]
    assert summaries and all(s[0].isupper() for s in summaries), summaries
    assert leaves()  # the grammar walk sees the commands too


def test_version_keys_are_aligned():
    r = runner.invoke(app, ["version"], terminal_width=120)
    starts = {len(line) - len(line.split(None, 1)[1]) for line in r.output.splitlines() if line}
    assert len(starts) == 1, r.output


def test_status_figures_are_written_for_people_and_processes_listed():
    from rich.console import Console

    from opsctl.commands.status import _number, _render

    assert _number(1048576.0) == "1,048,576" and _number(0.012345) == "0.01235"
    assert _number(None) == "-" and _number(3) == "3"
    doc = {"url": "http://127.0.0.1:8000", "health_status": 200, "healthy": True,
           "state": "ready", "reason": None, "vllm_version": "0.32.0", "platform": None,
           "models": ["tiny-llama"], "canary": None, "metrics_error": None,
           "metrics": {"kv_capacity_tokens": 1048576.0, "kv_cache_usage": 0.25},
           "processes": [{"pid": 11, "role": "APIServer"}, {"pid": 12, "role": "EngineCore"}]}  # fmt: skip
    console = Console(width=200, record=True)
    _render(console, doc)
    text = console.export_text()
    assert "1,048,576" in text and "e+06" not in text and "0.25" in text
    assert "APIServer 11, EngineCore 12" in text
    assert "not reported" in text  # platform unknown says why, not "-"


def test_an_unreachable_url_is_said_once():
    """The state is the result (stdout, issue 23); why is the one stderr line."""
    r = CliRunner().invoke(app, ["status", "127.0.0.1:1"])
    assert r.exit_code == 3
    assert "unreachable" in r.stdout and "ConnectError" not in r.stdout, r.stdout
    assert r.stderr.count("ConnectError") == 1, r.stderr


def test_runs_list_explains_its_pid_column(tmp_path, monkeypatch):
    from rich.console import Console

    from opsctl.ui.render_runs import render_list

    run = {"name": "r1", "state": "live", "model": "tiny-llama", "url": None,
           "started_at": None, "alive_pids": [1, 2], "pids": {"1": 0, "2": 0, "3": 0},
           "disk_bytes": 10, "reason": "x"}  # fmt: skip
    console = Console(width=200, record=True)
    render_list(console, {"runs_dir": str(tmp_path), "runs": [run], "counts": {"live": 1}})
    text = console.export_text()
    assert "alive/pids" in text and "2/3" in text
    assert "processes of the run still alive / processes it started" in text


def test_the_stall_alert_window_reads_as_seconds():
    from opsctl.domain import alert_rules

    rules = alert_rules.rules_yaml(None)
    assert "[9s999ms]" in rules and "9999ms" not in rules
