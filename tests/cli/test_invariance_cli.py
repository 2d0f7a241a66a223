"""`opsctl diag invariance` CLI contract without an engine: bad options exit 2 with one
stderr line, an unreachable URL exits 3, and (with the per-mode run faked) `--mode both`
runs default then eager and shows both verdicts side by side; exit 0 only on pass."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.commands.diag import invariance, invariance_run

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["diag", "invariance", *args])


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("opsctl: error:")]


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
        (["--timeout", "0"], "--timeout must be positive"),
        (["--batch-via", "carrier-pigeon"], "--batch-via must be one of list, requests"),
        (["http://127.0.0.1:1", "--model", "tiny-llama"], "give either a URL or --model"),
        (["http://127.0.0.1:1", "--mode", "both"], "--mode both needs opsctl to start the engine"),
        (["not a url"], "not an http(s) URL"),
        (["--prompts", "/nonexistent/prompts.txt"], "cannot read prompts file"),
    ],
)
def test_bad_options_exit_2_with_one_line(args, needle):
    r = invoke(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = error_lines(r)
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert r.stdout == ""


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
    assert invariance.read_prompts(None) == list(invariance.DEFAULT_PROMPTS)
    from pathlib import Path

    assert invariance.read_prompts(Path(prompts_file("a\n\n b \n", "x.txt"))) == ["a", " b "]
    assert invariance.read_prompts(Path(prompts_file('["x", "y", ""]', "x.json"))) == ["x", "y"]


def test_unreachable_url_exits_3():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: nobody else can take it meanwhile
        r = invoke(f"http://127.0.0.1:{s.getsockname()[1]}", "--json")
    assert r.exit_code == 3, r.stderr
    assert "no server answered" in error_lines(r)[0] and r.stdout == ""


def fake_run(mode, verdict, largest):
    prompts = [
        {
            "index": i,
            "status": "identical" if verdict == "pass" else ("diverged" if i == 1 else "identical"),
            "reason": "",
            "prompt": f"prompt {i}",
            "largest_diff": 0.0 if i != 1 else largest,
            "tokens_identical": True,
            "largest_diff_position": None,
            "compared_positions": 4,
            "first_divergence": None
            if verdict == "pass" or i != 1
            else {
                "position": 2,
                "kind": "logprob",
                "token_alone": 7,
                "token_batched": 7,
                "logprob_alone": -1.0,
                "logprob_batched": -1.0 + largest,
                "diff": largest,
                "detail": "",
            },
        }
        for i in range(2)
    ]
    reasons = [] if verdict == "pass" else ["prompt 1: first divergence at position 2 (logprob)"]
    return {
        "mode": mode,
        "requested_mode": mode,
        "verdict": verdict,
        "url": "http://x",
        "external": False,
        "run_dir": None,
        "model": "tiny-llama",
        "vllm_version": "0.32.0",
        "platform": "cpu",
        "execution": {
            "enforce_eager": mode == "eager",
            "compilation_mode": "NONE" if mode == "eager" else "DYNAMO_TRACE_ONCE",
        },
        "summary": {
            "verdict": verdict,
            "prompts": 2,
            "identical": 2 if verdict == "pass" else 1,
            "within_atol": 0,
            "diverged": 0 if verdict == "pass" else 1,
            "errors": 0,
            "tokens_identical": True,
            "largest_diff": 0.0 if verdict == "pass" else largest,
            "comparison": "bitwise",
            "reasons": reasons,
        },
        "settings": [
            {
                "name": "prefix caching",
                "wanted": "off",
                "seen": "False",
                "status": "verified",
                "source": "s",
            }
        ],
        "batch": {"source": "batch probe", "max_batch": 2, "steps": 4, "wanted": 2, "formed": True},
        "warnings": [],
        "prompts": prompts,
        "seconds": {"engine": 1.0, "bs1": 0.1, "bsn": 0.05, "total": 1.2},
    }


@pytest.fixture
def fake_modes(monkeypatch):
    calls: list = []
    verdicts = {"default": ("pass", 0.0), "eager": ("fail", 4.77e-7)}

    def run_mode(req, mode, emit, rows):
        calls.append((mode, req.batch_size, req.max_tokens, req.logprobs, req.atol))
        emit({"phase": f"{mode}: fake"})
        return fake_run(mode, *verdicts[mode])

    monkeypatch.setattr(invariance_run, "run_mode", run_mode)
    return calls, verdicts


def test_mode_both_runs_default_then_eager_side_by_side(fake_modes, prompts_file):
    calls, _ = fake_modes
    r = invoke("--mode", "both", "--prompts", prompts_file("a\nb\n"), "--max-tokens", "4", "--json")
    assert [c[0] for c in calls] == ["default", "eager"]
    assert calls[0][1:] == (2, 4, 5, None)
    doc = json.loads(r.stdout)
    assert [(x["mode"], x["verdict"]) for x in doc["runs"]] == [
        ("default", "pass"),
        ("eager", "fail"),
    ]
    assert doc["verdict"] == "fail" and r.exit_code == 1
    assert doc["reasons"] == ["[eager] prompt 1: first divergence at position 2 (logprob)"]
    assert "batch invariance failed" in error_lines(r)[0]


def test_rich_output_shows_both_verdicts_and_the_divergence(fake_modes, prompts_file):
    r = invoke("--mode", "both", "--prompts", prompts_file("a\nb\n"))
    assert r.exit_code == 1
    out = r.stdout
    assert "default" in out and "eager" in out and "PASS" in out and "FAIL" in out
    assert "pos 2 logprob" in out and "4.77e-07" in out
    assert "DYNAMO_TRACE_ONCE" in out and "compilation_mode=NONE" in out


def test_exit_0_only_when_every_run_passed(fake_modes, prompts_file):
    calls, verdicts = fake_modes
    verdicts["eager"] = ("pass", 0.0)
    r = invoke("--mode", "both", "--prompts", prompts_file("a\nb\n"), "--atol", "1e-6", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "pass" and doc["comparison"] == "atol=1e-06" and doc["atol"] == 1e-6
    assert calls[0][4] == 1e-6


def test_default_mode_when_opsctl_starts_the_engine():
    assert invariance.plan_modes(None, None) == ["default"]
    assert invariance.plan_modes(None, "both") == ["default", "eager"]
    assert invariance.plan_modes("http://x", None) == [None]
    assert invariance.plan_modes("http://x", "eager") == ["eager"]


def test_pooling_model_is_refused_before_any_engine_starts():
    import psutil
    from typer.testing import CliRunner

    from opsctl.cli import app

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = CliRunner().invoke(app, ["diag", "invariance", "--model", "tiny-embed", "--json"])
    assert r.exit_code == 2, r.stderr
    assert "needs a generative model" in r.stderr and r.stdout == ""
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()
