"""CLI contract: exit codes, JSON on stdout, one clear line on stderr for bad input.
None of these start an engine (bad input is rejected before anything is spawned)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("opsctl: error:")]


def test_models_list_json_has_schema_and_both_base_models():
    r = invoke("models", "list", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.models.list/1"
    by_name = {m["name"]: m for m in doc["models"]}
    assert by_name["tiny-llama"]["archetype"] == "decoder"
    assert by_name["tiny-hybrid"]["archetype"] == "hybrid-decoder"


def test_models_build_into_dir(tmp_path):
    r = invoke("models", "build", "tiny-llama", "--out", str(tmp_path), "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["models"][0]["size_bytes"] > 100_000
    assert (tmp_path / "tiny-llama" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["serve", "no-such-model", "--no-tui"], "unknown embedded model 'no-such-model'"),
        (["serve", "/nonexistent/model/dir", "--no-tui"], "does not exist"),
        (["serve", "--no-tui", "--load-format", "pt"], "--load-format must be one of"),
        (["serve", "--no-tui", "--timeout", "0"], "--timeout must be positive"),
        (["status", "not a url"], "not an http(s) URL"),
        (["patches", "--run", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle):
    r = invoke(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = error_lines(r)
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert r.stdout == ""


def test_malformed_config_json_is_bad_input(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    r = invoke("serve", str(tmp_path), "--no-tui")
    assert r.exit_code == 2
    assert "is not valid JSON" in error_lines(r)[0]


def test_port_in_use_is_bad_input_and_spawns_nothing(tmp_path, monkeypatch):
    import psutil

    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        r = invoke("serve", "--no-tui", "--port", str(port))
    assert r.exit_code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in error_lines(r)[0]
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_status_unreachable_exits_3():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        r = invoke("status", f"http://127.0.0.1:{port}", "--json")
    assert r.exit_code == 3
    assert "no server answered" in error_lines(r)[0]


def test_usage_error_exit_2():
    r = invoke("serve", "--port", "notanumber")
    assert r.exit_code == 2


def test_tui_without_terminal_runs_plain_with_a_hint():
    # --tui under CliRunner (no TTY): a warning naming the plain flag, then the command
    # goes on plainly (here to the bad model name, which fails as usual)
    r = invoke("serve", "no-such-model", "--tui")
    assert "dashboard needs a terminal" in r.stderr and "--no-tui" in r.stderr
    assert r.exit_code == 2 and "unknown embedded model" in error_lines(r)[0]
