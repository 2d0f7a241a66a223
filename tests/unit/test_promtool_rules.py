"""The rules of `opsctl rules` proven by Prometheus's own tool (/usr/bin/promtool, Debian's
`prometheus` package): `promtool check rules` on the command's output, and `promtool test
rules` with input series per alert (fires when it should; silent on an idle server, a busy
healthy server and a drained one). The stall alert is also evaluated against the
console's own rule (prom_view.Progress, EndpointTracker's rule on raw samples) on the
same series, scrape by scrape: the two agree at every evaluation."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opsctl.console.judge_prom_view import Progress
from opsctl.domain import alert_rules

PROMTOOL = os.environ.get("OPSCTL_PROMTOOL", "/usr/bin/promtool")
JOB = "vllm"
LABELS = {"severity", "source"}


@pytest.fixture(scope="module")
def promtool() -> str:
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail(f"{PROMTOOL} missing: run `make prometheus` (apt-get install prometheus)")
    return PROMTOOL


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd)


def opsctl_rules(tmp: Path, *args: str) -> Path:
    out = tmp / "rules.yml"
    r = run(sys.executable, "-m", "opsctl", "rules", *args, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


# ---- input series -----------------------------------------------------------------------------


def series(name: str, instance: str, values: list[float | None], **labels: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in {"job": JOB, "instance": instance, **labels}.items())
    text = " ".join("_" if v is None else f"{v:g}" for v in values)
    return {"series": f"{name}{{{body}}}", "values": text}


def server(
    instance: str,
    n: int,
    running: list[float],
    gen: list[float],
    *,
    up: list[float] | None = None,
    waiting: list[float] | None = None,
    kv: list[float] | None = None,
    preempt: list[float] | None = None,
    ok: list[float] | None = None,
    errors: list[float] | None = None,
    ttft_slow: bool = False,
    steps: list[float] | None = None,
) -> list[dict]:
    """Every series the rules read of one vLLM server (n samples, one per second); engine
    steps move with generation unless given."""
    gaps = [g is None for g in gen]  # no samples there (a server that went away)
    zero = [None if gap else 0.0 for gap in gaps]

    def of(values, fn):
        return [None if v is None else fn(v) for v in values]

    steps = steps or of(gen, lambda g: g / 4)
    done = ok or of(gen, lambda g: g / 16)
    slow = of(done, round) if ttft_slow else zero
    fast = zero if ttft_slow else of(done, round)
    prompt = of(gen, lambda g: g * 2)
    out = [
        series("up", instance, up or [1.0] * n),
        series("vllm:num_requests_running", instance, running, model_name="m", engine="0"),
        series("vllm:num_requests_waiting", instance, waiting or zero, model_name="m", engine="0"),
        series("vllm:kv_cache_usage_perc", instance, kv or zero, model_name="m", engine="0"),
        series("vllm:generation_tokens_total", instance, gen, model_name="m", engine="0"),
        series("vllm:prompt_tokens_total", instance, prompt, model_name="m"),
        series("vllm:iteration_tokens_total_count", instance, steps, model_name="m"),
        series("vllm:num_preemptions_total", instance, preempt or zero, model_name="m"),
        series("vllm:request_success_total", instance, done, model_name="m",
               finished_reason="stop"),
        series("vllm:request_success_total", instance, errors or zero, model_name="m",
               finished_reason="error"),
        series("process_start_time_seconds", instance, [None if g else 1e3 for g in gaps]),
    ]  # fmt: skip
    total = [None if a is None else a + b for a, b in zip(fast, slow, strict=True)]
    for le, counts in (("0.5", fast), ("10", total), ("+Inf", total)):
        out.append(series("vllm:time_to_first_token_seconds_bucket", instance, counts, le=le))
    return [s for s in out if not all(v == "_" for v in s["values"].split())]


def ramp(n: int, step: float, start: float = 0.0) -> list[float]:
    return [start + step * i for i in range(n)]


def expected(name: str, instance: str, engine: str = "0") -> dict:
    """The alert ``name`` for ``instance`` (the stall alert: for its ``engine`` too)."""
    a = next(a for a in alert_rules.alerts(JOB) if a.name == name)
    per_engine = name == "VllmEngineStalled"  # judged per data-parallel engine

    def expand(s: str) -> str:
        return s.replace("{{ $labels.instance }}", instance).replace("{{ $labels.engine }}", engine)

    labels = {"severity": a.severity, "source": "opsctl", "job": JOB, "instance": instance}
    return {
        "exp_labels": labels | ({"engine": engine} if per_engine else {}),
        "exp_annotations": {"summary": expand(a.summary), "runbook": expand(a.runbook)},
    }


def checks(at: int, firing: dict[str, list[str]]) -> list[dict]:
    """One alert_rule_test per alert name at ``at`` seconds: exactly ``firing``'s instances."""
    return [
        {
            "eval_time": f"{at}s",
            "alertname": name,
            "exp_alerts": [expected(name, i) for i in firing.get(name, [])],
        }
        for name in alert_rules.ALERT_NAMES
    ]


def promtool_test(promtool: str, tmp: Path, rules: str, tests: list[dict]) -> None:
    (tmp / "rules.yml").write_text(rules)
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1s", "tests": tests}
    (tmp / "test.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    r = run(promtool, "test", "rules", "test.yml", cwd=tmp)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "SUCCESS" in r.stdout


# ---- promtool check rules -----------------------------------------------------------------


@pytest.mark.parametrize("args", [(), ("--job", "vllm", "--for", "2m")])
def test_promtool_checks_the_written_rules(promtool, tmp_path, args):
    path = opsctl_rules(tmp_path, *args)
    r = run(promtool, "check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 13 rules found" in r.stdout
    doc = yaml.safe_load(path.read_text())
    rules = [rule for g in doc["groups"] for rule in g["rules"]]
    named = {rule["alert"]: rule for rule in rules if "alert" in rule}
    assert set(named) == set(alert_rules.ALERT_NAMES)
    for rule in named.values():
        assert set(rule["labels"]) == LABELS
        assert rule["annotations"]["runbook"].startswith("opsctl ")
        assert rule["annotations"]["summary"]
    stalled = named["VllmEngineStalled"]
    assert stalled["for"] == ("2m" if args else "1m")
    assert "VllmEngineRestarted" in named and "for" not in named["VllmEngineRestarted"]
    if args:
        # every rule reads the job's series, but the canary's: the exporter's own job
        assert all('job="vllm"' in r["expr"] for r in rules if r.get("alert") != "VllmCanaryFailed")
        assert f'job="{alert_rules.CANARY_JOB}"' in named["VllmCanaryFailed"]["expr"]


# ---- promtool test rules: each alert fires, and stays silent where it must ---------------------

N = 60


def fleet_tests() -> list[dict]:
    """Idle, busy-healthy, drained and one server per failure mode, in one Prometheus."""
    n = N
    flat_after = [min(i, 20) * 10.0 for i in range(n)]  # generation stops at t=20
    inputs = (
        server("idle:1", n, [0.0] * n, [500.0] * n)
        + server("busy:1", n, [3.0] * n, ramp(n, 25), kv=[0.7] * n, waiting=[1.0] * n)
        + server("drained:1", n, [3.0] * 20 + [0.0] * (n - 20), flat_after)
        + server("stalled:1", n, [2.0] * n, flat_after)
        # a long prefill: no token after t=20, but the engine steps on: slow, not stalled
        + server("prefill:1", n, [1.0] * n, flat_after, steps=ramp(n, 1))
        + server("kv:1", n, [8.0] * n, ramp(n, 30), kv=[0.95] * n, preempt=ramp(n, 0.5))
        + server("errors:1", n, [1.0] * n, ramp(n, 10), ok=ramp(n, 1), errors=ramp(n, 1))
        + server("ttft:1", n, [4.0] * n, ramp(n, 20), ttft_slow=True)
        + server("down:1", n, [1.0] * 10 + [None] * (n - 10), ramp(10, 5) + [None] * (n - 10),
                 up=[1.0] * 10 + [0.0] * (n - 10))
        + server("restarted:1", n, [1.0] * n, ramp(40, 10) + ramp(n - 40, 10))
    )  # fmt: skip
    alert_checks = (
        checks(4, {})  # nothing yet: --for (5 s) has not passed
        + checks(
            25,  # generation flat since t=20: the stall window has not passed
            {
                "VllmKvCacheSaturated": ["kv:1"],
                "VllmRequestErrors": ["errors:1"],
                "VllmTtftP99High": ["ttft:1"],
                "VllmTargetDown": ["down:1"],
            },
        )
        + checks(
            35,  # stalled since t=30 (window 10 s from t=20) for 5 s (--for 5s)
            {
                "VllmEngineStalled": ["stalled:1"],
                "VllmKvCacheSaturated": ["kv:1"],
                "VllmRequestErrors": ["errors:1"],
                "VllmTtftP99High": ["ttft:1"],
                "VllmTargetDown": ["down:1"],
            },
        )
        + checks(
            42,
            {
                "VllmEngineStalled": ["stalled:1"],
                "VllmKvCacheSaturated": ["kv:1"],
                "VllmRequestErrors": ["errors:1"],
                "VllmTtftP99High": ["ttft:1"],
                "VllmTargetDown": ["down:1"],
                "VllmEngineRestarted": ["restarted:1"],  # counters went back at t=40
            },
        )
    )
    return [{"interval": "1s", "input_series": inputs, "alert_rule_test": alert_checks}]


def test_the_default_rules_fire_the_stall_alert_a_minute_after_the_stall_window(promtool, tmp_path):
    """`opsctl rules` as written by default (--for 1m): a server whose generation stops at
    t=20 is stalled from t=30 (the 10 s window) and its alert fires at t=90, not before; a
    busy healthy server beside it never. (The e2e test drives a real SIGSTOP through
    Prometheus and Alertmanager with --for 5s; this is the default's timing.)"""
    n = 100
    stopped = [min(i, 20) * 10.0 for i in range(n)]
    inputs = server("stalled:1", n, [2.0] * n, stopped) + server(
        "busy:1", n, [3.0] * n, ramp(n, 25)
    )
    stall_at = 20 + int(alert_rules.STALL_WINDOW_S)
    fires_at = stall_at + int(alert_rules.DEFAULT_FOR_S)
    at = checks(fires_at - 2, {}) + checks(fires_at + 1, {"VllmEngineStalled": ["stalled:1"]})
    tests = [{"interval": "1s", "input_series": inputs, "alert_rule_test": at}]
    promtool_test(promtool, tmp_path, alert_rules.rules_yaml(JOB), tests)


def test_each_alert_fires_and_idle_busy_drained_stay_silent(promtool, tmp_path):
    rules = alert_rules.rules_yaml(JOB, for_s=5)
    promtool_test(promtool, tmp_path, rules, fleet_tests())


def test_queue_backlog_and_restart_loop(promtool, tmp_path):
    n = 200
    restarts = ramp(50, 4) + ramp(50, 4) + ramp(50, 4) + ramp(50, 4)  # back 3 times
    inputs = (
        server("queue:1", n, [8.0] * n, ramp(n, 20), waiting=ramp(n, 0.5, 1))
        + server("steady:1", n, [8.0] * n, ramp(n, 20), waiting=[5.0] * n)  # long, not growing
        + server("loop:1", n, [1.0] * n, restarts)
    )
    wanted = ("VllmQueueBacklog", "VllmRestartLoop", "VllmEngineRestarted")
    at = {  # restarts at t=50, 100, 150; the queue grows from the start
        90: {"VllmQueueBacklog": ["queue:1"]},  # the first restart (t=50) held 10 s: over
        100: {"VllmEngineRestarted": ["loop:1"], "VllmQueueBacklog": ["queue:1"]},
        140: {"VllmQueueBacklog": ["queue:1"]},  # two restarts: no loop yet
        165: {"VllmQueueBacklog": ["queue:1"], "VllmRestartLoop": ["loop:1"]},
    }
    alert_checks = [c for t, f in at.items() for c in checks(t, f) if c["alertname"] in wanted]
    tests = [{"interval": "1s", "input_series": inputs, "alert_rule_test": alert_checks}]
    promtool_test(promtool, tmp_path, alert_rules.rules_yaml(JOB, for_s=5), tests)


def test_without_job_the_rules_span_jobs_and_skip_other_targets(promtool, tmp_path):
    """No --job: a down target that never exported vLLM series (node exporter, the /health
    job) is no VllmTargetDown; a vLLM one in any job is."""
    n = 40
    inputs = server("a:1", n, [1.0] * 10 + [None] * 30, ramp(10, 5) + [None] * 30,
                    up=[1.0] * 10 + [0.0] * 30)  # fmt: skip
    inputs.append({"series": 'up{job="node",instance="n:1"}', "values": "0x40"})
    test = {"interval": "1s", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "30s", "alertname": "VllmTargetDown", "exp_alerts": [expected(
            "VllmTargetDown", "a:1") | {"exp_annotations": {
                "summary": "a:1: Prometheus cannot scrape this vLLM server",
                "runbook": "opsctl status http://a:1"}}]}]}  # fmt: skip
    promtool_test(promtool, tmp_path, alert_rules.rules_yaml(None, for_s=5), [test])


# ---- the stall alert IS the console's rule ------------------------------------------------------


def console_stalled(
    running: list[float], gen: list[float], steps: list[float], kv: list[float]
) -> list[bool]:
    """The console's verdict at each scrape (t = index seconds): prom_view.Progress, the
    EndpointTracker rule replayed on raw samples, with the console's default window."""
    p = Progress()
    out = []
    for t, point in enumerate(zip(running, gen, steps, kv, strict=True)):
        p.feed([(float(t), *point)])
        stall_for = p.stall(alert_rules.STALL_WINDOW_S)
        out.append(stall_for is not None)
    return out


def random_run(rng: random.Random, n: int) -> tuple[list[float], list[float]]:
    """Stretches of flat and moving generation, with and without requests running."""
    running, gen, g = [], [], 100.0
    while len(running) < n:
        length = rng.choice([1, 3, 8, 9, 10, 11, 12, 20])
        r = rng.choice([0.0, 1.0, 2.0, 2.0])
        moving = rng.random() < 0.4
        for _ in range(length):
            g += rng.choice([1.0, 7.0]) if moving else 0.0
            running.append(r)
            gen.append(g)
    return running[:n], gen[:n]


def test_the_stall_alert_agrees_with_the_console_rule_on_the_same_series(promtool, tmp_path):
    """Every second of several runs: the alert fires (no --for) exactly when the console's
    rule calls the endpoint stalled; both read alert_rules.STALL_WINDOW_S."""
    from opsctl.console.judge_state import Settings

    assert Settings().stall_window_s == alert_rules.STALL_WINDOW_S
    rng = random.Random(27)
    n = 90
    runs = [(*random_run(rng, n), None) for _ in range(6)]
    runs.append(([2.0] * n, [min(i, 30) * 5.0 for i in range(n)], None))  # stalls at t=40
    # a long prefill as vLLM 0.32 publishes it: no token, no step, the KV cache filling
    # for 30 s, then flat: stalls at t=40
    runs.append(([1.0] * n, [50.0] * n, [min(i, 30) * 0.01 for i in range(n)]))
    tests, fired = [], 0
    for k, (running, gen, kv) in enumerate(runs):
        steps = [50.0] * n if kv is not None else [g / 4 for g in gen]
        kv = kv or [0.0] * n
        verdicts = console_stalled(running, gen, steps, kv)
        if k == len(runs) - 1:
            assert verdicts.index(True) == 40, verdicts  # not while the KV cache fills
        fired += sum(verdicts)
        inputs = server(f"s{k}:1", n, running, gen, steps=steps, kv=kv)
        alert_checks = [
            {
                "eval_time": f"{t}s",
                "alertname": "VllmEngineStalled",
                "exp_alerts": [expected("VllmEngineStalled", f"s{k}:1")] if v else [],
            }
            for t, v in enumerate(verdicts)
        ]
        tests.append({"interval": "1s", "input_series": inputs, "alert_rule_test": alert_checks})
    assert 20 < fired < len(runs) * n - 100  # both verdicts occur, many times
    promtool_test(promtool, tmp_path, alert_rules.rules_yaml(JOB, for_s=0), tests)


# ---- one engine of a data-parallel server stalls while the other serves (issue 44) -----------


def dp_series(instance: str, engines: dict[str, tuple[list[float], ...]]) -> list[dict]:
    """The stall rule's series of one DP server: per engine (running, gen, steps, kv), each
    labelled engine="N" as vLLM labels them, and the server's up."""
    n = len(next(iter(engines.values()))[0])
    out = [series("up", instance, [1.0] * n)]
    names = ("vllm:num_requests_running", "vllm:generation_tokens_total",
             "vllm:iteration_tokens_total_count", "vllm:kv_cache_usage_perc")  # fmt: skip
    for engine, values in engines.items():
        for name, vs in zip(names, values, strict=True):
            out.append(series(name, instance, vs, model_name="m", engine=engine))
    return out


def console_engines_stalled(engines: dict[str, tuple[list[float], ...]]) -> list[set[str]]:
    """The console's verdict at each scrape (t = index seconds): the engines it calls
    stalled, by the per-engine rule both sources run (EngineProgress + judge_engines)."""
    from opsctl.console.judge import EngineView
    from opsctl.console.judge_state import EngineProgress, judge_engines

    p = EngineProgress()
    n = len(next(iter(engines.values()))[0])
    out = []
    for t in range(n):
        p.feed({e: [(float(t), *(v[t] for v in vs))] for e, vs in engines.items()})
        readings = [
            EngineView(e, f"EngineCore_DP{e}", running=vs[0][t]) for e, vs in engines.items()
        ]
        judged = judge_engines(readings, p, alert_rules.STALL_WINDOW_S)
        out.append({e.engine for e in judged if e.state == "stalled"})
    return out


def test_one_engine_flat_while_the_other_moves_fires_for_that_engine_as_the_console_says(
    promtool, tmp_path
):
    """DP=2: engine 1 keeps 16 requests running with generation, steps and KV flat from t=20
    while engine 0 keeps generating: the summed series move all along (the rule summed by
    instance never fired: the 45 s of 'busy' in issue 44), the per-engine rule fires for
    engine 1 only, at exactly the evaluations the console calls engine 1 stalled."""
    n = 60
    moving = ([3.0] * n, ramp(n, 25), ramp(n, 6), [0.2 + 0.001 * i for i in range(n)])
    flat = ([16.0] * n, [min(i, 20) * 16.0 for i in range(n)],
            [min(i, 20) * 1.0 for i in range(n)], [0.4 + 0.001 * min(i, 20) for i in range(n)])  # fmt: skip
    # and a single-engine server with no engine label at all reads as before (engine "0")
    engines = {"0": moving, "1": flat}
    verdicts = console_engines_stalled(engines)
    assert verdicts.index({"1"}) == 30 and all(v <= {"1"} for v in verdicts), verdicts
    summed = console_stalled(*(list(map(sum, zip(*cols, strict=True)))
                               for cols in zip(*engines.values(), strict=True)))  # fmt: skip
    assert not any(summed)  # the old, summed reading of the same server: never stalled
    inputs = dp_series("dp:1", engines)
    lone = server("lone:1", n, [2.0] * n, [min(i, 20) * 10.0 for i in range(n)])
    for s in lone:  # no engine label anywhere: a server before vLLM labelled engines
        s["series"] = s["series"].replace(',engine="0"', "")
    lone_verdicts = console_stalled([2.0] * n, [min(i, 20) * 10.0 for i in range(n)],
                                    [min(i, 20) * 2.5 for i in range(n)], [0.0] * n)  # fmt: skip
    alert_checks = [
        {
            "eval_time": f"{t}s",
            "alertname": "VllmEngineStalled",
            "exp_alerts": [expected("VllmEngineStalled", "dp:1", e) for e in sorted(v)]
            + ([expected("VllmEngineStalled", "lone:1")] if lone_verdicts[t] else []),
        }
        for t, v in enumerate(verdicts)
    ]
    assert any(lone_verdicts)
    tests = [{"interval": "1s", "input_series": inputs + lone, "alert_rule_test": alert_checks}]
    promtool_test(promtool, tmp_path, alert_rules.rules_yaml(JOB, for_s=0), tests)
