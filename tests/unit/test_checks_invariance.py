"""`opsctl.suite.invariance.run.run` called directly (no CLI) against stand-in servers
(tests/standins/completions.py): the typed progress events, a planted divergence found at
its prompt and position, atol, the engine's records read back (settings, the batch that
formed, test knobs), the /metrics fallback, fail-closed on request errors, the engine
specs the check asks its session for, and --mode both keeping one mode's report when
the other engine fails. Real engines: tests/e2e/test_invariance*_e2e.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import jsonschema
import pytest

from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, Live, UrlTarget
from opsctl.domain import platform as plat
from opsctl.errors import BadInput, EngineDied, OpsTimeout
from opsctl.suite.invariance import judge_engine as eng
from opsctl.suite.invariance import run as check
from tests.expect import CPU_SETTINGS, settings_status
from tests.standins.completions import (
    VERSION,
    Behaviour,
    completions_server,
    register_run,
    write_run_dir,
)

PROMPTS = ("alpha beta", "a zebra crossing", "gamma delta")
ZEBRA, POS = 1, 2  # index of the prompt with the marker; the position the stand-in shifts


def options(**kw) -> check.Options:
    return check.Options(**{"prompts": PROMPTS, "max_tokens": 4, "logprobs": 2, **kw})


@pytest.fixture
def diverging(home):
    with completions_server(Behaviour(diverge=("zebra", POS, 4.77e-7))) as (url, b):
        yield url, b


def test_typed_events_and_report_of_a_planted_divergence(diverging):
    url, _ = diverging
    seen: list[ev.Event] = []
    report = check.run(UrlTarget(url), options(tag="t1"), seen.append)

    assert isinstance(seen[0], ev.Started) and seen[0].title == "diag invariance"
    assert isinstance(seen[-1], ev.Finished) and seen[-1].verdict == "fail"
    phases = [e.name for e in seen if isinstance(e, ev.Phase)]
    assert phases[0] == "server as is: BS=1: 3 prompts one at a time"  # a URL: no engine phase
    assert "server as is: BS=3: prompts sent together" in phases
    counted = [(e.done, e.total) for e in seen if isinstance(e, ev.Phase) and e.total]
    assert counted.count((3, 3)) == 3  # BS=1, its control and BS=N counted every request
    (case,) = [e for e in seen if isinstance(e, ev.CaseResult)]
    assert case.name == f"server as is: prompt {ZEBRA}" and case.verdict == "fail"
    assert case.detail.startswith(f"diverged: pos {POS} logprob")
    table = [e for e in seen if isinstance(e, ev.Table)][-1]
    assert table.columns == check.COLUMNS
    assert [r[3] for r in table.rows] == ["identical", "diverged", "identical"]
    logs = [e.text for e in seen if isinstance(e, ev.Log)]
    assert "server as is: BS=1 prompt 0: 4 tokens" in logs[0]
    assert any(t.startswith("server as is: verdict fail: prompt 1: first divergence") for t in logs)

    doc = report.to_dict()
    assert report.verdict == "fail" and not report.passed and not report.timed_out
    assert doc["schema"] == "opsctl.diag.invariance/3" and doc["request_tag"] == "t1"
    assert (doc["comparison"], doc["batch_size"], doc["prompts"]) == ("bitwise", 3, 3)
    assert report.reasons == [
        f"[server as is] prompt {ZEBRA}: first divergence at position {POS} (logprob)"
    ]
    (run,) = report.runs
    assert run["requested_mode"] is None and run["external"] is True
    assert run["model"] == "stand-in-llama" and run["vllm_version"] == VERSION
    div = run["prompts"][ZEBRA]["first_divergence"]
    assert (div["position"], div["kind"]) == (POS, "logprob")
    assert div["token_alone"] == div["token_batched"]
    assert div["diff"] == pytest.approx(4.77e-7, rel=1e-3)
    assert run["summary"]["tokens_identical"] is True
    # durations carry their unit (issue 23: `_s`), one name per fact
    assert isinstance(doc["duration_s"], float) and "seconds" not in doc
    assert set(run["durations_s"]) == {"engine", "bs1", "bsn", "total"} and "seconds" not in run
    assert all(isinstance(p["alone_s"], float) and p["batched_s"] >= 0 for p in run["prompts"])
    assert doc["test_knobs"] == {} and doc["warnings"] == []


def test_no_ledger_means_metrics_evidence_and_settings_not_verified(diverging):
    url, _ = diverging
    run = check.run(UrlTarget(url), options()).runs[0]
    assert run["run_dir"] is None and run["platform"] is None
    assert run["platform_note"] == plat.NOT_STARTED_NOTE  # no ledger, no /server_info
    batch = run["batch"]  # 3 prompts x 4 tokens in 4 engine steps: all 3 shared steps
    assert batch["source"] == "metrics (generated tokens per engine step)"
    assert (batch["tokens"], batch["steps"], batch["max_batch"], batch["formed"]) == (
        12,
        4,
        3,
        True,
    )
    status = {s["name"]: s["status"] for s in run["settings"]}
    assert status["prefix caching"] == status["VLLM_USE_FLASHINFER_SAMPLER"] == "not verified"
    assert status["greedy (temperature 0)"] == status["ignore_eos"] == "verified"
    assert any("could not enforce/verify" in w for w in run["warnings"])


def test_atol_turns_the_same_difference_into_a_pass(diverging):
    url, _ = diverging
    report = check.run(UrlTarget(url), options(atol=1e-6))
    assert report.verdict == "pass" and report.to_dict()["comparison"] == "atol=1e-06"
    assert [p["status"] for p in report.runs[0]["prompts"]] == [
        "identical",
        "within_atol",
        "identical",
    ]


def test_engine_records_read_back_settings_batch_and_knobs(home):
    run_dir = write_run_dir(
        home / "runs" / "r1",
        nudge={"marker": "zebra", "position": POS, "delta": 0.01},
        knobs={"OPSCTL_PROBE_NUDGE": "zebra:2"},
    )
    with completions_server(Behaviour(run_dir=run_dir)) as (url, _):
        register_run(run_dir, url)
        seen: list[ev.Event] = []
        report = check.run(UrlTarget(url), options(mode="eager", tag="t2"), seen.append)
    (run,) = report.runs
    assert run["run_dir"] == str(run_dir) and run["platform"] == "cpu"
    assert run["execution"] == {"enforce_eager": True, "compilation_mode": "NONE"}
    assert settings_status(run) == CPU_SETTINGS
    batch = run["batch"]
    assert (batch["source"], batch["max_batch"], batch["formed"]) == ("batch probe", 3, True)
    assert batch["per_prompt"] == {"0": 3, "1": 3, "2": 3} and batch["bs1_max_shared"] == 1
    assert report.verdict == "pass"
    assert any("TEST NUDGE" in w for w in run["warnings"])
    doc = report.to_dict()
    assert doc["test_knobs"] == {"OPSCTL_PROBE_NUDGE": "zebra:2"}
    assert report.warnings[0].startswith("TEST KNOBS active")
    assert any(isinstance(e, ev.Alert) and "TEST KNOBS" in e.text for e in seen)


def test_a_batch_short_of_n_together_is_sent_again(home):
    """4 prompts, the first attempt sampled as 2 + 2 (none alone, but never 4 together,
    as on a busy host where the engine starts before the last prompt arrives): sent
    again, and the judged attempt is the one where all 4 ran together."""
    run_dir = write_run_dir(home / "runs" / "r-split")
    prompts = (*PROMPTS, "epsilon zeta")
    seen: list[ev.Event] = []
    with completions_server(Behaviour(run_dir=run_dir, split=1)) as (url, b):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options(prompts=prompts), seen.append)
    batch = report.runs[0]["batch"]
    assert (batch["attempts"], batch["max_batch"], batch["formed"]) == (2, 4, True)
    assert report.verdict == "pass", report.reasons
    assert sum(len(x["prompt"]) > 1 for x in b.bodies if isinstance(x["prompt"], list)) == 2
    assert any(
        isinstance(e, ev.Log) and "attempt 1: at most 2 of the 4 prompts were sampled" in e.text
        for e in seen
    )


def test_separate_requests_the_probe_shows_never_batched_fail(home):
    run_dir = write_run_dir(home / "runs" / "r2")
    with completions_server(Behaviour(run_dir=run_dir)) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options(batch_via="requests"))
    run = report.runs[0]
    assert run["batch"]["via"] == "requests" and run["batch"]["alone"] == [0, 1, 2]
    assert report.verdict == "fail"
    assert any("ran alone in the BS=3 phase" in r for r in report.reasons)


def test_separate_requests_without_probe_is_a_warning_not_a_failure(home):
    with completions_server() as (url, _):
        run = check.run(UrlTarget(url), options(batch_via="requests")).runs[0]
    assert run["batch"]["formed"] is False and run["verdict"] == "pass"
    assert any("could not show that BS=3 formed a batch" in w for w in run["warnings"])


def test_request_errors_fail_closed_with_the_servers_reason(home):
    with completions_server(Behaviour(max_logprobs=0)) as (url, _):
        report = check.run(UrlTarget(url), options())
    prompts = report.runs[0]["prompts"]
    assert [p["status"] for p in prompts] == ["error"] * 3
    assert prompts[0]["reason"].startswith("BS=1: request error: HTTP 400")
    assert "greater than max allowed: 0" in prompts[0]["reason"]
    assert report.verdict == "fail" and report.runs[0]["summary"]["errors"] == 3


def test_pooling_server_is_bad_input(home):
    with (
        completions_server(Behaviour(generative=False)) as (url, _),
        pytest.raises(BadInput, match="needs a generative model"),
    ):
        check.run(UrlTarget(url), options())


def test_plan_refuses_before_anything_starts():
    with pytest.raises(BadInput, match="--mode both needs opsctl to start the engine"):
        check.plan(UrlTarget("http://127.0.0.1:9"), options(mode="both"))
    with pytest.raises(BadInput, match="needs a generative model"):
        check.plan(EngineSpec("tiny-embed"), options())
    modes = [m for m, _ in check.plan(EngineSpec(), options(mode="both"))]
    assert modes == ["default", "eager"]
    assert [m for m, _ in check.plan(EngineSpec(), options())] == ["default"]
    assert [m for m, _ in check.plan(UrlTarget("http://x"), options())] == [None]


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"mode": "fast"}, "--mode must be one of default, eager, both"),
        ({"batch_size": 1}, "--batch-size must be at least 2"),
        ({"batch_size": 4}, "--batch-size 4 is larger than the number of prompts (3)"),
        ({"prompts": ("one",)}, "a batch needs at least 2"),
        ({"timeout": 0}, "--timeout must be positive"),
        ({"batch_via": "pigeon"}, "--batch-via must be one of list, requests"),
    ],
)
def test_options_refuse_bad_values(kw, needle):
    with pytest.raises(BadInput, match=needle.replace("(", r"\(").replace(")", r"\)")):
        options(**kw)


def test_isolated_spec_keeps_the_callers_settings_and_is_idempotent():
    base = EngineSpec(
        "tiny-llama",
        extra_args=("--seed", "1"),
        env=(("A", "1"),),
        knobs=(("K", "v"),),
        probes=frozenset({"mm_uuid"}),
        max_num_seqs=4,
    )
    spec = check.isolated_spec(base, "eager", options(timeout=12.0))
    assert spec.extra_args == ("--seed", "1", *check.ISOLATING_ARGS)
    assert dict(spec.env) == {"A": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert spec.probes == {"mm_uuid", "batch", "gate"} and spec.knobs == (("K", "v"),)
    assert spec.enforce_eager is True and spec.max_num_seqs == 4 and spec.timeout == 12.0
    assert check.isolated_spec(spec, "eager", options(timeout=12.0)) == spec
    default = check.isolated_spec(EngineSpec(), "default", options(batch_size=3))
    assert default.model == "tiny-llama" and default.enforce_eager is False
    assert default.max_num_seqs == 8  # at least the batch


class StandInSession:
    """An engine session whose 'engines' are stand-in servers, one per execution mode:
    records the specs the check asks for; an exception instead of a Live is an engine
    that fails to start."""

    def __init__(self, by_mode: dict[str, Live | Exception]) -> None:
        self.by_mode, self.asked = by_mode, []

    @contextlib.contextmanager
    def open(self, target, progress=ev.ignore, *, label="check"):
        self.asked.append((label, target))
        got = self.by_mode["eager" if target.enforce_eager else "default"]
        if isinstance(got, Exception):
            raise got
        progress(ev.EngineReady(got.url, 0.1))
        yield got


@pytest.fixture
def mode_standins(home):
    """A default-mode engine that matches and an eager one that diverges."""
    default_dir = write_run_dir(
        home / "runs" / "default",
        info={"enable_prefix_caching": False, "enforce_eager": False, "compilation_mode": "2"},
    )
    eager_dir = write_run_dir(home / "runs" / "eager")
    with (
        completions_server(Behaviour(run_dir=default_dir)) as (d_url, _),
        completions_server(Behaviour(run_dir=eager_dir, diverge=("zebra", POS, 4.77e-7))) as (
            e_url,
            _,
        ),
    ):
        yield {
            "default": Live(d_url, run_dir=default_dir, external=False),
            "eager": Live(e_url, run_dir=eager_dir, external=False),
        }


def test_mode_both_runs_default_then_eager_on_the_isolated_engines(mode_standins):
    session = StandInSession(mode_standins)
    spec = EngineSpec(knobs=(("OPSCTL_PROBE_NUDGE", "zebra:2"),))
    report = check.run(spec, options(mode="both", timeout=30.0), session=session)
    assert [label for label, _ in session.asked] == ["invariance-default", "invariance-eager"]
    for (_, asked), eager in zip(session.asked, (False, True), strict=True):
        assert asked.enforce_eager is eager and asked.model == "tiny-llama"
        assert asked.extra_args == check.ISOLATING_ARGS and asked.probes == {"batch", "gate"}
        assert dict(asked.env) == check.ISOLATING_ENV and asked.timeout == 30.0
        assert asked.knobs == spec.knobs
    runs = {r["mode"]: r for r in report.runs}
    assert [runs["default"]["verdict"], runs["eager"]["verdict"]] == ["pass", "fail"]
    assert runs["default"]["execution"]["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert report.verdict == "fail"
    assert report.reasons == [
        f"[eager] prompt {ZEBRA}: first divergence at position {POS} (logprob)"
    ]

    from rich.console import Console

    from opsctl.suite.invariance.view import render

    con = Console(record=True, width=220)
    render(con, report.to_dict())
    out = con.export_text()
    assert "PASS" in out and "FAIL" in out and f"pos {POS} logprob" in out and "4.77e-07" in out
    assert "compilation_mode=DYNAMO_TRACE_ONCE" in out and "compilation_mode=NONE" in out


@pytest.mark.parametrize(
    ("error", "timed_out"),
    [
        (EngineDied("engine exited with code 1 before becoming healthy: boom"), False),
        (OpsTimeout("server did not become healthy within 10 s"), True),
    ],
)
def test_mode_both_keeps_the_other_report_when_one_engine_fails(mode_standins, error, timed_out):
    seen: list[ev.Event] = []
    session = StandInSession({**mode_standins, "default": error})
    report = check.run(EngineSpec(), options(mode="both", atol=1e-6), seen.append, session)
    default, eager = report.runs
    assert default["verdict"] == "fail" and default["error"] == error.message
    assert default["timed_out"] is timed_out and report.timed_out is timed_out
    assert eager["verdict"] == "pass" and len(eager["prompts"]) == 3
    assert report.verdict == "fail"
    assert report.reasons == [f"[default] {error.message}"]
    assert ev.Phase("default: failed") in seen
    from rich.console import Console

    from opsctl.suite.invariance.view import render

    con = Console(record=True, width=220)
    render(con, report.to_dict())  # a failed mode renders without crashing
    assert "FAIL" in con.export_text()


def test_one_mode_whose_engine_fails_raises(mode_standins):
    session = StandInSession({**mode_standins, "default": EngineDied("boom")})
    with pytest.raises(EngineDied):
        check.run(EngineSpec(), options(), session=session)


def test_the_tui_panel_shows_progress_and_the_divergence(diverging):
    from textual.widgets import DataTable, RichLog

    from opsctl.ui.diag_app import DiagApp

    url, _ = diverging

    async def drive():
        app = DiagApp("diag invariance", lambda p: check.run(UrlTarget(url), options(), p))
        async with app.run_test(size=(140, 40)) as pilot:
            await asyncio.wait_for(asyncio.to_thread(app.done.wait, 60), 65)
            await pilot.pause(0.1)
            lines = [str(line.text) for line in app.query_one(RichLog).lines]
            return app.report, app.query_one(DataTable).row_count, lines

    report, rows, lines = asyncio.run(drive())
    assert report is not None and report.verdict == "fail"
    assert rows == 3
    assert any(f"prompt {ZEBRA} -> fail: diverged" in line for line in lines), lines


SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def test_a_failed_mode_names_no_platform_and_no_duration():
    """A mode whose engine never compared anything: null (not "?" or "-") for what it
    could not know, and why the platform is unknown."""
    run = check.failed_run("eager", "engine died", timed_out=False)
    assert run["platform"] is None and run["platform_note"] == eng.FAILED_RUN_PLATFORM_NOTE
    assert run["durations_s"] == {"engine": None, "bs1": None, "bsn": None, "total": None}
    schema = json.loads((SCHEMAS / "opsctl.diag.invariance-3.schema.json").read_text())
    jsonschema.Draft7Validator(schema["properties"]["runs"]["items"]).validate(run)
