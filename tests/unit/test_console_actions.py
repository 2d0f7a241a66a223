"""The console's action logic without a UI: which checks fit which model kind, the
command-mode parser, admin answers (a 404 names the setting that exposes the route),
check jobs in threads (events, result, first finding, error, cancel), the replay's
playback (pace, pause, step, speed) and the recording codec."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from opsctl.checks import events as ev
from opsctl.checks.report import Report
from opsctl.console import actions as act
from opsctl.console import judge as c
from opsctl.console import verbs
from opsctl.console.judge_state import EndpointTracker
from opsctl.console.replay import Recorder, ReplaySource, decode, encode
from opsctl.domain import admin_routes as adm
from opsctl.domain.check_registry import GENERATIVE
from opsctl.errors import BadInput

ARCHS = {
    "cross-encoder": ["BertForSequenceClassification"],
    "bi-encoder": ["BertModel"],
    "vision-language": ["Idefics3ForConditionalGeneration"],
    "decoder": ["LlamaForCausalLM"],
}


def view(run_dir: str | None = None, models=()) -> c.EndpointView:
    target = c.Target("n", "http://127.0.0.1:1", "argument", run_dir=run_dir)
    v = EndpointTracker(target).view
    from dataclasses import replace

    return replace(v, info=c.EngineInfo("0.32.0", tuple(models)))


def model_dir(tmp_path: Path, kind: str) -> str:
    d = tmp_path / kind
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ARCHS[kind]}))
    return str(d)


@pytest.mark.parametrize(
    ("kind", "url_checks"),
    [("cross-encoder", ["usage"]), ("bi-encoder", ["usage"]),
     ("vision-language", ["invariance", "mm-uuid"]), ("decoder", ["invariance"])],
)  # fmt: skip
def test_checks_follow_the_model_kind_and_kv_fail_needs_an_opsctl_server(
    tmp_path, kind, url_checks
):
    root = model_dir(tmp_path, kind)
    v = view(models=[c.ModelInfo("m", 256, root)])  # the server's /v1/models root
    assert [x.name for x in act.applicable(v)] == url_checks
    ours = [x.name for x in act.applicable(v, ours=True)]
    assert ours == url_checks + (["kv-fail"] if kind in GENERATIVE else [])
    with pytest.raises(BadInput, match="does not apply"):
        act.choose(v, "kv-fail")


def test_unknown_kind_offers_every_url_check_and_embedded_names_are_known():
    unknown = act.applicable(view(models=[c.ModelInfo("remote-model", 256, "/not/here")]))
    assert [x.name for x in unknown] == ["usage", "invariance", "mm-uuid"]
    assert "model kind unknown" in unknown[0].why
    named = act.applicable(view(models=[c.ModelInfo("tiny-reranker", 256, None)]))
    assert [x.name for x in named] == ["usage"] and "embedded model" in named[0].why
    with pytest.raises(BadInput, match="unknown check"):
        act.choose(view(), "nope")


@pytest.mark.parametrize(
    ("text", "verb", "args"),
    [
        ("diag invariance", "diag", {"check": "invariance"}),
        ("serve", "serve", {"model": "tiny-llama"}),
        ("serve /m --weights real --port 9000", "serve",
         {"model": "/m", "weights": "real", "port": 9000}),
        ("stop", "stop", {}), ("restart", "restart", {}), ("q", "quit", {}),
        ("runs clean", "runs-clean", {}), ("runs clean --older-than 2h", "runs-clean",
                                          {"older_than": 7200.0}),
        ("runs bundle --out /tmp/x.tgz", "runs-bundle", {"out": Path("/tmp/x.tgz")}),
        ("admin reset_prefix_cache", "admin", {"route": "reset_prefix_cache"}),
    ],
)  # fmt: skip
def test_command_mode_parses_the_cli_verbs(text, verb, args):
    cmd = verbs.parse(text)
    assert (cmd.verb, cmd.args) == (verb, args)


@pytest.mark.parametrize(
    "text", ["", "diag", "serve a b", "serve --port x", "runs prune", "admin", "frobnicate"]
)
def test_command_mode_refuses_with_the_usage(text):
    with pytest.raises(BadInput):
        verbs.parse(text)


def test_admin_answers():
    r = adm.route("reset-prefix-cache")
    assert r.dev and r.destructive
    dev = adm.outcome(r, 404, {"detail": "Not Found"}, None, "0.32.0")
    assert not dev.ok and "VLLM_SERVER_DEV_MODE=1" in dev.text and "0.32" in dev.text
    other = adm.outcome(r, 404, {}, None, "0.31.2")
    assert "this server reports vLLM 0.31.2" in other.text
    always = adm.outcome(adm.route("load"), 404, {}, None, "0.32.0")
    assert "registered by every vLLM 0.32 server" in always.text
    assert adm.outcome(r, 200, {"success": False}, None, None).ok is False
    ok = adm.outcome(adm.route("/is_sleeping"), 200, {"is_sleeping": True}, None, None)
    assert ok.ok and "'is_sleeping': True" in ok.text
    assert "no answer" in adm.outcome(r, None, None, "ConnectError", None).text
    assert "API key" in adm.outcome(r, 401, {}, None, None).text
    with pytest.raises(KeyError):
        adm.route("collective_rpc")


def test_first_finding_prefers_failures_then_reasons():
    doc = {"findings": [{"severity": "info", "message": "i"}, {"severity": "fail", "message": "f"}]}
    assert act.first_finding(doc) == "f"
    assert (
        act.first_finding({"reasons": ["[eager] prompt 3 diverged"]}) == "[eager] prompt 3 diverged"
    )
    assert act.first_finding({}) is None


def test_jobs_run_in_threads_with_events_result_error_and_cancel():
    seen: list[tuple[int, dict]] = []
    jobs = act.Jobs(on_event=lambda j, s: seen.append((j.id, s)))
    v = view()
    choice = act.CheckChoice("usage", "test")
    gate = threading.Event()

    def passing(progress):
        progress(ev.Started("diag usage", "checking"))
        progress(ev.Phase("requests"))
        gate.wait(10)
        doc = {"schema": "opsctl.diag.usage/1", "findings": [{"severity": "fail", "message": "x"}]}
        return Report("fail", doc)

    def failing(progress):
        raise BadInput("not a pooling model", hint="try invariance")

    def endless(progress):
        while True:
            progress(ev.Phase("looping"))
            time.sleep(0.01)

    j1 = jobs.start(choice, v, passing)
    j2 = jobs.start(choice, v, failing)
    j3 = jobs.start(choice, v, endless)
    deadline = time.monotonic() + 10
    while j1.phase != "requests" or not j2.error:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert j1.running and j3.running and jobs.notes()[v.target.url] == "2 checks running"
    j3.cancelled.set()
    gate.set()
    assert jobs.wait(10)
    assert (j1.state, j1.verdict, j1.finding) == ("done", "fail", "x")
    assert j1.note() == "usage: FAIL (x)"
    assert j2.state == "error" and j2.note() == "usage: ERROR not a pooling model"
    assert j3.state == "cancelled"
    err = [s for i, s in seen if i == j2.id][-1]
    assert err["verdict"] == "fail" and "hint: try invariance" in err["events"]
    assert jobs.notes()[v.target.url] == "usage: cancelled"  # the last job's


# ---- record / replay ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def frames(n: int) -> list[c.FleetSnapshot]:
    out = []
    for i in range(n):
        v = view()
        from dataclasses import replace

        v = replace(v, state="busy", figures=c.Figures(running=float(i), generation_tps=10.0 * i,
                    latency={"ttft": c.Quantiles(p50=0.01 * i)}))  # fmt: skip
        out.append(c.FleetSnapshot(1000.0 + i, (v,), 1.0))
    return out


def test_recording_round_trips_and_replay_plays_pauses_steps_and_changes_speed(tmp_path):
    snaps = frames(5)
    assert decode(encode(snaps[3])) == snaps[3]
    path = tmp_path / "rec.jsonl"
    rec = Recorder(path)
    for i, s in enumerate(snaps):
        rec.write(s, {"http://127.0.0.1:1": f"note {i}"})
        rec.write(s, {"http://127.0.0.1:1": f"note {i}"})  # same frame again: not written
    rec.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["schema"] == "opsctl.console-record/1"
    clock = Clock()
    src = ReplaySource(path, clock=clock)
    src.start()
    assert src.collect() == snaps[0] and src.notes() == {"http://127.0.0.1:1": "note 0"}
    clock.t = 2.5  # recorded pace: frame 2
    assert src.collect() == snaps[2]
    src.set_paused(True)
    clock.t = 10
    assert src.collect() == snaps[2] and "paused" in src.status_line()
    src.step(1)
    assert src.collect() == snaps[3]
    src.step(-2)
    assert src.collect() == snaps[1]
    assert src.series("http://127.0.0.1:1", "running") == [0.0, 1.0]
    assert src.series("http://127.0.0.1:1", "ttft_p50") == [0.0, 0.01]
    src.faster()
    src.set_paused(False)
    clock.t = 11  # 1 s at x2: two frames on
    assert src.collect() == snaps[3] and "x2" in src.status_line()
    clock.t = 100
    assert src.collect() == snaps[4] and src.at_end and "end" in src.status_line()


def test_replay_refuses_what_is_not_a_recording(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": "opsctl.console/1"}\n')
    with pytest.raises(BadInput, match="not a console recording"):
        ReplaySource(bad)
    head = json.dumps({"schema": "opsctl.console-record/1"})
    (tmp_path / "empty.jsonl").write_text(head + "\n")
    with pytest.raises(BadInput, match="no frames"):
        ReplaySource(tmp_path / "empty.jsonl")
    cut = tmp_path / "cut.jsonl"  # a session killed mid-line still replays
    rec = Recorder(cut)
    rec.write(frames(1)[0])
    rec.close()
    cut.write_text(cut.read_text() + '{"t": 1, "snap')
    assert len(ReplaySource(cut).frames) == 1


def test_the_start_form_takes_the_console_words_and_vllms_names():
    """One definition (opsctl.domain.weights): real -> auto, dummy -> dummy, and vLLM's
    names as given; anything else is BadInput (the form shows the line)."""
    from opsctl.console.servers import StartRequest
    from opsctl.domain.weights import LOAD_FORMATS, load_format_of

    assert load_format_of("real") == "auto" and load_format_of("dummy") == "dummy"
    assert [load_format_of(f) for f in LOAD_FORMATS] == list(LOAD_FORMATS)
    with pytest.raises(BadInput, match="weights are dummy or real"):
        StartRequest(weights="pt")
