"""CLI tests of `opsctl diag kv-fail` (no engine): bad input exits 2 with one line,
and the command maps the pipeline's verdict to JSON on stdout and the exit code."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from opsctl.cli import app


def run(*args: str):
    return CliRunner().invoke(app, ["diag", "kv-fail", *args])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "1.5"], "outside 0..1"),
        (["--rate", "-0.5"], "outside 0..1"),
        (["--rate", "0.2", "--blocks", "-1"], "either --rate or --blocks"),
        (["--blocks", "1:x"], "blocks spec"),
        (["--policy", "retry"], "unknown policy"),
        (["--requests", "0"], "--requests"),
        (["--model", "no-such-model"], "unknown embedded model"),
        (["--model", "/nonexistent/dir"], "does not exist"),
        (["--model", "tiny-embed"], "cannot serve"),
        (["--model", "tiny-vlm"], "cannot serve"),
    ],
)
def test_bad_input_exits_2(args, needle):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    assert needle in res.stderr
    assert res.stderr.startswith("opsctl: error:")


def test_mamba_model_dir_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["GraniteMoeHybridForCausalLM"],
                "layer_types": ["mamba", "attention"],
            }
        )
    )
    res = run("--model", str(tmp_path))
    assert res.exit_code == 2 and "recurrent" in res.stderr


def _report(verdict: str) -> dict:
    return {
        "vllm_version": "0.32.0",
        "platform": "cpu",
        "model": "tiny-hybrid",
        "kv_cache_groups": [
            {"spec": "SlidingWindowSpec", "sliding_window": 32},
            {"spec": "FullAttentionSpec"},
        ],
        "kv_load_failure_policy": "recompute",
        "patch": {"name": "kv_hybrid_recompute", "status": "applied"},
        "injection": {"mode": "blocks", "blocks": "-1", "rate": None, "seed": 0, "targets": [0]},
        "failures_injected": 2,
        "requests_affected": 1,
        "tokens_recomputed": 96,
        "requests_failed": 0,
        "engine_alive": verdict == "pass",
        "outputs_identical": verdict == "pass",
        "findings": [
            {
                "severity": "ok" if verdict == "pass" else "fail",
                "code": "x",
                "message": "engine died during the inject phase",
                "details": {},
            }
        ],
        "verdict": verdict,
        "requests": [],
        "run_dir": "/tmp/x",
        "seconds": 1.0,
    }


@pytest.mark.parametrize(("verdict", "code"), [("pass", 0), ("fail", 1)])
def test_verdict_maps_to_exit_code(monkeypatch, verdict, code):
    from opsctl.commands.diag import kv_fail_run

    seen = {}

    def fake_run(req, emit):
        seen["req"] = req
        emit({"phase": "inject", "events": ["injected: request #0"]})
        return _report(verdict)

    monkeypatch.setattr(kv_fail_run, "run", fake_run)
    res = run(
        "--model",
        "tiny-hybrid",
        "--policy",
        "recompute",
        "--blocks",
        "1:-1",
        "--seed",
        "5",
        "--json",
    )
    assert res.exit_code == code, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "opsctl.diag.kv-fail/1" and doc["verdict"] == verdict
    s = seen["req"].settings
    assert (s.blocks, s.seed, s.policy, s.no_patch) == ("1:-1", 5, "recompute", False)
    if code:
        assert "engine died" in res.stderr


def test_plain_render(monkeypatch):
    from opsctl.commands.diag import kv_fail_run

    monkeypatch.setattr(kv_fail_run, "run", lambda req, emit: _report("pass"))
    res = run("--no-patch")
    assert res.exit_code == 0
    assert "verdict: PASS" in res.stdout and "SlidingWindowSpec(window 32)" in res.stdout


def test_live_event_lines_show_injections_and_recoveries(tmp_path):
    """What --tui (and stderr) shows while the inject phase runs: each injection and
    each recovery once, as they land in the run's event files."""
    from opsctl.commands.diag.kv_fail_run import Request, _event_lines, _Phases
    from opsctl.domain.kv_fail import Settings, keys_of, make_prompts

    prompts = make_prompts(2, 0, 320)
    ph = _Phases(Request("tiny-hybrid", Settings()), lambda snap: None, prompts, [1], "tiny-hybrid")
    events = tmp_path / "events"
    events.mkdir()
    key = keys_of(prompts)[1]
    (events / "kv_injections.jsonl").write_text(
        json.dumps(
            {"key": key, "group": 1, "block": 9, "position": 2, "epoch": "inject", "reported": True}
        )
        + "\n"
    )
    (events / "kv_recoveries.jsonl").write_text(
        json.dumps(
            {
                "action": "recomputed",
                "requests": 1,
                "tokens": 96,
                "groups": 2,
                "policy": "recompute",
            }
        )
        + "\n"
    )
    lines = _event_lines(ph, tmp_path)
    assert lines == [
        "injected: request #1 group 1 block 9 position 2 (inject)",
        "patch: recomputed 1 request(s), 96 tokens (2 KV cache groups, policy recompute)",
    ]
    assert _event_lines(ph, tmp_path) == []  # nothing new
    rows = ph.table()
    assert rows[1][2] == "yes" and rows[0][2] == "no"
