"""The `diag invariance` pipeline with the engine and HTTP faked: what it asks of the
engine it starts (isolating settings, execution mode, the batch probe), how it reads the
engine's records back, a planted divergence in the report and in the live snapshots,
and the same pipeline driving the --tui panel."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from opsctl.collectors import completions as cc
from opsctl.commands.diag import common
from opsctl.commands.diag import invariance_run as ir
from opsctl.commands.diag.invariance import ISOLATING_ARGS
from opsctl.domain.invariance import Generated

TAG = "opsctl-inv-test"


def gen(lp1: float) -> Generated:
    return Generated((5, 6), (-1.0, lp1), ({5: -1.0, 9: -3.0}, {6: lp1, 9: -3.0}), "length")


def timed(g: Generated) -> cc.Timed:
    return cc.Timed(g, 0.01, "rid")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    (run_dir / "events").mkdir(parents=True)
    info = {
        "enable_prefix_caching": False,
        "mm_processor_cache_gb": None,
        "enforce_eager": True,
        "compilation_mode": "0",
        "platform": "cpu",
    }
    (run_dir / "events" / "engine_info.jsonl").write_text(json.dumps(info) + "\n")
    ids = [f"cmpl-{TAG}-eager-bs2-g0-0123abcd-{i}-ff" for i in range(2)]
    batch = [
        {"event": "init", "role": "worker", "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}},
        {"event": "step", "num_reqs": 1, "req_ids": [f"cmpl-{TAG}-eager-bs1-p0-aa-0-ff"]},
        {"event": "step", "num_reqs": 2, "req_ids": ids},
    ]
    (run_dir / "events" / "batch.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batch))
    calls: list[dict] = []

    @contextlib.contextmanager
    def engine_target(url, model, **kw):
        calls.append(kw)
        yield common.Target("http://fake", object(), run_dir, external=False)

    class Sampler:
        samples = [2.0]
        steps = tokens = None

        def __init__(self, url, **kw):
            pass

        def settle(self, expected_tokens):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(common, "engine_target", engine_target)
    monkeypatch.setattr(cc, "served_model", lambda url, **kw: "tiny-llama")
    monkeypatch.setattr(cc, "server_version", lambda url, **kw: "0.32.0")
    monkeypatch.setattr(cc, "completions_refusal", lambda url, model, **kw: None)
    monkeypatch.setattr(cc, "RunningSampler", Sampler)
    monkeypatch.setattr(
        cc,
        "run_alone",
        lambda url, p, prompts, tag, cb=None, **kw: [timed(gen(-2.0)), timed(gen(-2.0))],
    )
    monkeypatch.setattr(
        cc,
        "run_together_list",
        lambda url, p, prompts, tag, n, cb=None, **kw: [timed(gen(-2.0)), timed(gen(-2.0 + 1e-3))],
    )
    return calls


def request(**kw) -> ir.Request:
    base = dict(
        url=None,
        model="tiny-llama",
        prompts=["a", "b"],
        batch_size=2,
        max_tokens=2,
        logprobs=1,
        atol=None,
        modes=["eager"],
        timeout=10.0,
        tag=TAG,
    )
    return ir.Request(**{**base, **kw})


def test_pipeline_report_and_what_it_asked_of_the_engine(fake):
    snaps: list[dict] = []
    report = ir.run_all(request(), snaps.append)
    (kw,) = fake
    assert kw["extra_args"] == ISOLATING_ARGS and kw["enforce_eager"] is True
    assert kw["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and "batch" in kw["env"]["OPSCTL_PROBES"]
    assert report["verdict"] == "fail" and report["comparison"] == "bitwise"
    (run,) = report["runs"]
    assert [p["status"] for p in run["prompts"]] == ["identical", "diverged"]
    div = run["prompts"][1]["first_divergence"]
    assert (div["position"], div["kind"], div["token_alone"]) == (1, "logprob", 6)
    assert run["batch"]["max_batch"] == 2 and run["batch"]["alone"] == []
    assert run["execution"] == {"enforce_eager": True, "compilation_mode": "NONE"}
    assert {s["status"] for s in run["settings"]} <= {"verified", "not applicable"}
    # live snapshots: rows per prompt and the divergence as an event
    events = [e for s in snaps for e in s.get("events", [])]
    assert any("prompt 1: diverged: pos 1 logprob" in e for e in events), events
    rows = [s["rows"] for s in snaps if s.get("rows")][-1]
    assert [r[3] for r in rows] == ["identical", "diverged"]
    assert snaps[-1]["verdict"] == "fail"


def test_atol_turns_the_same_difference_into_a_pass(fake):
    report = ir.run_all(request(atol=1e-2), lambda s: None)
    assert report["verdict"] == "pass" and report["comparison"] == "atol=0.01"
    assert [p["status"] for p in report["runs"][0]["prompts"]] == ["identical", "within_atol"]


def test_the_tui_panel_shows_progress_and_the_divergence(fake):
    from textual.widgets import DataTable, RichLog

    from opsctl.ui.diag_app import DiagApp

    async def drive():
        app = DiagApp("diag invariance", lambda emit: ir.run_all(request(), emit))
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(100):
                if app.done.is_set():
                    break
                await pilot.pause(0.05)
            await pilot.pause(0.1)
            table = app.query_one(DataTable)
            log = app.query_one(RichLog)
            lines = [str(line.text) for line in log.lines]
            return app.report, table.row_count, lines

    report, rows, lines = asyncio.run(drive())
    assert report is not None and report["verdict"] == "fail"
    assert rows == 2
    assert any("prompt 1: diverged" in line for line in lines), lines


def test_mode_both_keeps_the_first_report_when_the_second_engine_dies(fake, monkeypatch):
    from opsctl.errors import EngineDied

    inner = common.engine_target

    @contextlib.contextmanager
    def flaky(url, model, **kw):
        if not kw["enforce_eager"]:  # the default-mode engine dies at startup
            raise EngineDied("engine exited with code 1 before becoming healthy: boom")
        with inner(url, model, **kw) as t:
            yield t

    monkeypatch.setattr(common, "engine_target", flaky)
    report = ir.run_all(request(modes=["eager", "default"], atol=1e-2), lambda s: None)
    eager, default = report["runs"]
    assert eager["verdict"] == "pass" and len(eager["prompts"]) == 2
    assert default["verdict"] == "fail" and "boom" in default["error"]
    assert report["verdict"] == "fail"
    assert any("[default]" in r and "boom" in r for r in report["reasons"])
    from rich.console import Console

    console = Console(record=True, width=200)
    ir.render(console, report)  # a failed mode renders without crashing
    assert "FAIL" in console.export_text()


def test_single_mode_engine_death_still_raises(fake, monkeypatch):
    from opsctl.errors import EngineDied

    @contextlib.contextmanager
    def dead(url, model, **kw):
        raise EngineDied("boom")
        yield  # pragma: no cover

    monkeypatch.setattr(common, "engine_target", dead)
    with pytest.raises(EngineDied):
        ir.run_all(request(), lambda s: None)


def test_mode_both_engine_timeout_is_reported_then_exit_4(fake, monkeypatch):
    from opsctl.errors import OpsTimeout

    inner = common.engine_target

    @contextlib.contextmanager
    def slow(url, model, **kw):
        if not kw["enforce_eager"]:
            raise OpsTimeout("server did not become healthy within 10 s")
        with inner(url, model, **kw) as t:
            yield t

    monkeypatch.setattr(common, "engine_target", slow)
    report = ir.run_all(request(modes=["eager", "default"]), lambda s: None)
    assert [r.get("timed_out", False) for r in report["runs"]] == [False, True]


def test_pooling_server_is_bad_input(fake, monkeypatch):
    from opsctl.errors import BadInput

    monkeypatch.setattr(cc, "completions_refusal", lambda url, model, **kw: "HTTP 404: Not Found")
    with pytest.raises(BadInput, match="needs a generative model"):
        ir.run_all(request(), lambda s: None)
