"""`opsctl diag invariance` CLI contract without an engine: bad options exit 2 with one
stderr line, an unreachable URL exits 3, a pooling model is refused before any engine
starts; against a stand-in server (tests/standins/completions.py) the JSON report, the
rich tables, the knob warning on stderr and the exit code (0 only when every prompt
matched). `--mode both` side by side: tests/unit/test_checks_invariance.py (stand-ins)
and tests/e2e/test_invariance_modes_e2e.py (real engines)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.suite.invariance import flags as invariance
from opsctl.suite.invariance import run as check
from tests.standins.cli_result import assert_bad_input, error_lines
from tests.standins.completions import Behaviour, completions_server, register_run, write_run_dir

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["diag", "invariance", *args])


@pytest.fixture
def prompts_file(tmp_path):
    def make(content: str, name: str = "p.txt"):
        f = tmp_path / name
        f.write_text(content)
        return str(f)

    return make


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "fast"], "--mode must be one of default, eager, both"),
        (["--batch-size", "1"], "--batch-size must be at least 2"),
        (["--batch-size", "9"], "--batch-size 9 is larger than the number of prompts (8)"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--logprobs", "-1"], "--logprobs must be 0 or more"),
        (["--atol", "-1"], "--atol must be a finite number >= 0"),
        (["--atol", "inf"], "--atol must be a finite number >= 0"),
        (["--timeout", "0"], "--timeout: must be more than zero"),
        (["--batch-via", "carrier-pigeon"], "--batch-via must be one of list, requests"),
        (["http://127.0.0.1:1", "--model", "tiny-llama"], "give either a URL or --model"),
        (["http://127.0.0.1:1", "--mode", "both"], "--mode both needs opsctl to start the engine"),
        (["not a url"], "not an http(s) URL"),
        (["--prompts", "/nonexistent/prompts.txt"], "cannot read prompts file"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, needle):
    r = invoke(*args)
    assert_bad_input(r, needle)


@pytest.mark.parametrize(
    ("content", "name", "needle"),
    [
        ("only one prompt\n\n", "p.txt", "holds 1 prompt(s); a batch needs at least 2"),
        ("[1, 2]", "p.json", "must hold a JSON list of strings"),
        ("[not json", "p.json", "is not valid JSON"),
    ],
)
def test_bad_prompts_files(prompts_file, content, name, needle):
    r = invoke("--prompts", prompts_file(content, name))
    assert r.exit_code == 2 and needle in error_lines(r)[0], r.stderr


def test_prompts_file_formats(prompts_file):
    from pathlib import Path

    assert invariance.read_prompts(None) is None  # the check's defaults
    assert check.Options().prompts == check.DEFAULT_PROMPTS
    assert invariance.read_prompts(Path(prompts_file("a\n\n b \n", "x.txt"))) == ("a", " b ")
    assert invariance.read_prompts(Path(prompts_file('["x", "y", ""]', "x.json"))) == ("x", "y")


def test_unreachable_url_exits_3():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: nobody else can take it meanwhile
        r = invoke(f"http://127.0.0.1:{s.getsockname()[1]}", "--json")
    assert r.exit_code == 3, r.stderr
    assert "no server answered" in error_lines(r)[0]
    doc = json.loads(r.stdout)  # --json: a document whatever happened (issue 23)
    assert doc["schema"] == "opsctl.error/1" and doc["state"] == "unreachable"
    assert doc["command"] == "diag invariance" and doc["exit_code"] == 3


DIVERGED = "diverged: pos 2 logprob: tok 695/695 lp -1.5/-1.499999523 Δ 4.77e-07"


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A stand-in server (tests/standins/completions.py) whose prompts containing "zebra"
    diverge at position 2 when batched, with the run directory of an eager engine that
    honoured a test knob (OPSCTL_HOME of this test)."""
    home = tmp_path / "home"
    monkeypatch.setenv("OPSCTL_HOME", str(home))
    run_dir = write_run_dir(home / "runs" / "r", knobs={"OPSCTL_PROBE_NUDGE": "zebra:2"})
    with completions_server(Behaviour(diverge=("zebra", 2, 4.77e-7), run_dir=run_dir)) as (
        url,
        _,
    ):
        register_run(run_dir, url)
        yield url


def test_json_report_of_a_divergence_exit_1(standin, prompts_file):
    r = invoke(standin, "--mode", "eager", "--prompts", prompts_file("a\nzebra b\n"), "--json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.diag.invariance/3"
    assert (doc["batch_size"], doc["max_tokens"], doc["logprobs"], doc["atol"]) == (2, 16, 5, None)
    (run,) = doc["runs"]
    assert (run["mode"], run["verdict"]) == ("eager", "fail")
    assert doc["reasons"] == ["[eager] prompt 1: first divergence at position 2 (logprob)"]
    (line,) = error_lines(r)
    assert "batch invariance failed: [eager] prompt 1" in line
    assert "hint: --atol X allows a stated logprob tolerance" in r.stderr
    # the knob warning: in the report, in the progress log, and said after the run
    assert doc["test_knobs"] == {"OPSCTL_PROBE_NUDGE": "zebra:2"}
    assert doc["warnings"][0].startswith("TEST KNOBS active")
    lines = r.stderr.splitlines()
    said = [i for i, x in enumerate(lines) if x.startswith("warning: TEST KNOBS active")]
    assert len(said) == 1 and said[0] > lines.index("  eager: prompt 1 -> fail: " + DIVERGED)
    assert "eager: BS=2: prompts sent together" in r.stderr


def test_rich_output_shows_the_verdict_and_the_divergence(standin, prompts_file):
    r = invoke(standin, "--mode", "eager", "--prompts", prompts_file("a\nzebra b\n"))
    assert r.exit_code == 1
    out = r.stdout
    assert "eager" in out and "FAIL" in out and "verified" in out
    assert "pos 2 logprob" in out and "4.77e-07" in out
    assert "compilation_mode=NONE" in out and "2 together (batch probe)" in out


def test_exit_0_only_when_every_prompt_matched(standin, prompts_file):
    r = invoke(standin, "--prompts", prompts_file("a\nzebra b\n"), "--atol", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "pass" and doc["comparison"] == "atol=1e-06" and doc["atol"] == 1e-6
    r = invoke(standin, "--prompts", prompts_file("a\nb\nc\nd\n"), "--batch-size", "2", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["runs"][0]["batch"]["per_prompt"] == {str(i): 2 for i in range(4)}
    # 3 prompts in batches of 2: the last one ran alone, so BS=N was not tested for it
    r = invoke(standin, "--prompts", prompts_file("a\nb\nc\n"), "--batch-size", "2", "--json")
    assert r.exit_code == 1 and "prompt(s) [2] ran alone in the BS=2 phase" in error_lines(r)[0]


def test_pooling_model_is_refused_before_any_engine_starts():
    import psutil
    from typer.testing import CliRunner

    from opsctl.cli import app

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = CliRunner().invoke(app, ["diag", "invariance", "--model", "tiny-embed", "--json"])
    assert r.exit_code == 2, r.stderr
    assert "needs a generative model" in r.stderr and r.stdout == ""
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()
