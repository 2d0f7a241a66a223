"""`opsctl diag kv-fail` and its library entry point without an engine: bad input exits
2 with one line; the flags reach the engine the check starts (through the real check and
engine session, up to the recorded launch options); the live event lines; the terminal
rendering of a document the domain builds. The verdict, exit codes and JSON on a real
engine are in tests/e2e/test_kv_fail.py."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.cli import app
from opsctl.errors import BadInput
from opsctl.suite.kv_fail import judge as dom
from opsctl.suite.kv_fail import judge_report as kvr
from opsctl.suite.kv_fail import run as kv_fail


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
        (["--timeout", "0"], "--timeout: must be more than zero"),
        (["--model", "no-such-model"], "unknown embedded model"),
        (["--model", "/nonexistent/dir"], "does not exist"),
        (["--model", "tiny-embed"], "cannot serve"),
        (["--model", "tiny-vlm"], "cannot serve"),
        (["--mode", "graphs"], "--mode must be eager or default"),
        (["--route", "layers"], "unknown route"),
        (["--seeds", "4-2"], "--seeds: '4-2': the range ends before it starts"),
        (["--seeds", "0-4", "--seed", "1"], "either --seed or --seeds"),
        (["--seeds", "1,1"], "named twice"),
        (["--seed", "0-4"], "--seed: '0-4' is not an integer"),
        (["--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (["--kv-cache-memory-bytes", "0"], "must be positive"),
        (["--kv-cache-memory-bytes", "1G"], "'1G' is not an integer"),
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


def test_url_target_is_bad_input_and_starts_nothing(monkeypatch):
    """kv-fail needs an engine opsctl starts with the connector; a URL (even one that
    answers nothing) is refused before any request or engine start."""
    from opsctl.engine import server as srv

    def no_engine(*a, **k):
        raise AssertionError("an engine was started for a URL target")

    monkeypatch.setattr(srv, "EngineServer", no_engine)
    events: list[ev.Event] = []
    with pytest.raises(BadInput, match="needs an engine opsctl starts") as info:
        kv_fail.run(UrlTarget("http://127.0.0.1:9"), kv_fail.Options(), events.append)
    assert "http://127.0.0.1:9" in str(info.value) and events == []
    with pytest.raises(BadInput, match=r"outside 0\.\.1"):
        kv_fail.run(EngineSpec(), kv_fail.Options(dom.Settings(rate=2.0)))


@pytest.fixture
def launches(monkeypatch, tmp_path):
    """The launch options (and start timeout) of every engine the check asks for; the
    engine is never started (its health wait raises BadInput, exit 2)."""
    from opsctl.engine import server as srv

    seen: list = []

    class Recorder:
        def __init__(self, opts) -> None:
            self.opts, self.run_dir, self.url = opts, tmp_path, "http://127.0.0.1:9"
            seen.append(self)

        def start(self):
            return self

        def wait_healthy(self, timeout, on_tick=None):
            self.timeout = timeout
            raise BadInput("recorded; not starting")

        def stop(self, *a, **k):
            return srv.StopReport(0.0, [], [], [], [], None)

    monkeypatch.setattr(srv, "EngineServer", Recorder)
    return seen


def test_gpu_memory_flags_reach_vllm(launches):
    res = run("--gpu-memory-utilization", "0.08", "--kv-cache-memory-bytes", "1073741824")
    assert res.exit_code == 2 and "recorded; not starting" in res.stderr, res.output
    args = list(launches[0].opts.extra_args)
    i, j = args.index("--gpu-memory-utilization"), args.index("--kv-cache-memory-bytes")
    assert (args[i + 1], args[j + 1]) == ("0.08", "1073741824")


def test_a_sweep_announces_its_first_seed_and_starts_one_engine(launches):
    res = run("--seeds", "3,5")
    assert res.exit_code == 2 and "recorded; not starting" in res.stderr, res.output
    assert len(launches) == 1  # the start failed: nothing is retried per seed
    assert "sweep of seeds 3, 5: every seed on one engine while it lives" in res.stderr


def test_flags_reach_the_engine_the_check_starts(launches):
    res = run(
        "--no-patch", "--policy", "fail", "--blocks", "1:-1", "--seed", "5", "--timeout", "42"
    )
    assert res.exit_code == 2 and "recorded; not starting" in res.stderr, res.output
    (engine,) = launches
    opts = engine.opts
    # --no-patch: every KV recovery patch
    assert opts.disable_patches == ["kv_hybrid_recompute", "kv_async_inflight", "kv_rewind_v2"]
    assert engine.timeout == 42 and opts.label == "kv-fail" and opts.model.name == "tiny-hybrid"
    args = opts.extra_args
    cfg = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert cfg["kv_connector"] == "FaultInjectingConnector"
    assert cfg["kv_connector_module_path"] == "engine_patches.connectors.fault_kv"
    assert cfg["kv_load_failure_policy"] == "fail"  # --policy
    assert cfg["kv_connector_extra_config"]["inject"]["enabled"] is False  # the store phase
    assert args[args.index("--block-size") + 1] == "32" and "--no-enable-prefix-caching" in args
    # the workload the check announced before the start: --seed picks the targets
    targets = dom.choose_targets(4, 5, None)
    assert f"4 requests, targets {targets}, policy fail, blocks 1:-1" in res.stderr

    res = run("--model", "tiny-llama")
    assert res.exit_code == 2, res.output
    assert launches[-1].opts.disable_patches == [] and launches[-1].timeout == 600
    assert launches[-1].opts.model.name == "tiny-llama"
    assert launches[-1].opts.enforce_eager is True  # --mode eager, the default

    res = run("--model", "tiny-llama", "--mode", "default")
    assert res.exit_code == 2, res.output
    assert launches[-1].opts.enforce_eager is False  # vLLM's own execution mode

    res = run("--model", "tiny-llama", "--route", "requests")
    assert res.exit_code == 2, res.output
    args = launches[-1].opts.extra_args
    extra = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["route"] == "requests"


def test_live_event_lines_show_injections_and_recoveries(tmp_path):
    """What --tui (and stderr) shows while the inject phase runs: each injection and
    each recovery once, as they land in the run's event files."""
    from opsctl.suite.kv_fail.collect import EventTail

    work = dom.workload(dom.Settings(requests=2, targets=1), 320)
    events = tmp_path / "events"
    events.mkdir()
    tail = EventTail(tmp_path)
    injection = {
        "key": work.keys[1],
        "group": 1,
        "block": 9,
        "position": 2,
        "epoch": "inject",
        "reported": True,
    }
    (events / "kv_injections.jsonl").write_text(json.dumps(injection) + "\n")
    recovery = {"action": "recomputed", "requests": 1, "tokens": 96, "groups": 2}
    (events / "kv_recoveries.jsonl").write_text(json.dumps({**recovery, "policy": "recompute"}))
    (inj,) = tail.injections()
    (rec,) = tail.recoveries()
    lines = [
        *kv_fail.Injected(work.keys.index(inj.key), inj).snapshot()["events"],
        *kv_fail.Recovered(rec).snapshot()["events"],
    ]
    assert lines == [
        "injected: request #1 group 1 block 9 position 2 (inject)",
        "patch: recomputed 1 request(s), 96 tokens (2 KV cache groups, policy recompute)",
    ]
    assert tail.injections() == () and tail.recoveries() == ()  # nothing new
    rows = kv_fail.table(kvr.request_rows(work.prompts, (1,), {}, (), {1: 1}))
    assert rows[1][2] == "yes" and rows[0][2] == "no" and rows[1][4] == "1"


def test_terminal_report_of_a_domain_document():
    """The terminal view of a document the domain builds (groups with their window,
    the per-request table, the findings and the verdict)."""
    from opsctl.suite.kv_fail.view import render

    s = dom.Settings()
    work = dom.workload(s, 320)
    out = dom.Output(True, "length", (5, 6), (-0.1, -0.2))
    outputs = {p: [out] * 4 for p in ("store", "roundtrip", "inject", "sensitivity")}
    rows = kvr.request_rows(work.prompts, work.targets, outputs, {"roundtrip", "inject"}, {0: 2})
    facts = kvr.Facts(s, rows, roundtrip_loads=4, injections=2)
    info = {
        "kv_cache_groups": [
            {"spec": "SlidingWindowSpec", "sliding_window": 32},
            {"spec": "FullAttentionSpec"},
        ],
        "platform": "cpu",
    }
    records = [{"role": "engine_core", "vllm_version": "0.32.0", "patches": []}]
    fields = kvr.report_fields(
        facts,
        model="tiny-hybrid",
        engine=kvr.engine_facts(info, records),
        targets=work.targets,
        recoveries=(),
        metrics=None,
        phase_seconds={},
        baseline=outputs["store"],
        prompts=work.prompts,
        run_dir="/tmp/x",
    )
    con = Console(record=True, width=160)
    render(con, {**fields, "duration_s": 1.0})
    text = con.export_text()
    assert "verdict: PASS" in text and "SlidingWindowSpec(window 32)" in text
    assert "2 KV cache group(s)" in text and "0.32.0" in text and "identical" in text
    assert "noise floor 0 (store/reload bitwise equal): compared bitwise" in text


def test_probe_of_a_reused_engine_sees_only_its_own_run(tmp_path):
    """An engine session may give a second kv-fail run the engine of the first: the
    new probe starts with an empty KV store (its store phase stores again) and counts
    only the injections that came after it."""
    from engine_patches.connectors.injection import InjectionPlan
    from opsctl.suite.kv_fail.collect import KvProbe, write_control

    events = tmp_path / "events"
    events.mkdir()
    first = {"key": "old", "group": 0, "epoch": "inject", "reported": True}
    (events / "kv_injections.jsonl").write_text(json.dumps(first) + "\n")
    stored = tmp_path / "kv_store" / "old"
    stored.mkdir(parents=True)
    (stored / "meta.json").write_text("{}")
    write_control(tmp_path / "kv_store", InjectionPlan(epoch="before"))
    with KvProbe("http://127.0.0.1:9", tmp_path, server=None) as probe:
        assert not stored.exists() and (tmp_path / "kv_store" / "control.json").is_file()
        assert probe.injections() == () and probe.tail.injections() == ()
        with (events / "kv_injections.jsonl").open("a") as f:
            f.write(json.dumps({**first, "key": "new"}) + "\n")
        assert [i.key for i in probe.injections()] == ["new"]
        assert [i.key for i in probe.tail.injections()] == ["new"]
        assert probe.tail.injections() == ()
