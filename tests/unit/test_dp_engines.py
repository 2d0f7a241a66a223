"""One data-parallel engine stalled among healthy ones (issue 44 item 3), in the pure
domain and against stand-ins: each engine (vLLM's ``engine`` label) judged on its own by
the one stall rule in the direct tracker, ``--once``'s settle, the Prometheus view, the
canary (one per idle engine, ``X-data-parallel-rank``) and ``status``; the per-engine
views, the row's "1/2 engines stalled", the replica-imbalance finding; and a
single-engine server read exactly as before.

The case that said busy: engine 1 keeps 16 requests running with generation, steps and
KV cache flat while engine 0 keeps generating: the summed counters move, so the old
rule (one reading per endpoint) never called it stalled."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.checks import status
from opsctl.checks.target import UrlTarget
from opsctl.console import judge as c
from opsctl.console import judge_advisor as advisor
from opsctl.console import judge_prom as prom
from opsctl.console import judge_prom_view as prom_view
from opsctl.console.judge_state import (
    EndpointTracker,
    Settings,
    canary_engines,
    decide,
    judge_engine_canaries,
    settle_undecided,
    undecided,
)
from opsctl.console.render_advice import engine_lines, engines_cell, reason_cell
from opsctl.console.report import document
from opsctl.domain.metrics import parse_samples
from opsctl.domain.metrics_fast import parse_samples_fast
from tests.standins.base import StandInVllm, serving
from tests.standins.vllm_server import METRICS
from tests.unit.test_console_domain import scrape

URL = "http://127.0.0.1:9"
TARGET = c.Target("t", URL, "argument")
RUN, GEN, STEPS, KV, WAIT = (
    "vllm:num_requests_running",
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
)
SCHEMA = Path(__file__).resolve().parents[1] / "data/schemas/opsctl.console-4.schema.json"


def dp_body(engines: dict[str, dict[str, float]]) -> str:
    """The recorded real body with each engine="0" vLLM line once per engine (as vLLM
    writes a DP server's /metrics), the given series set per engine."""
    out = []
    for line in METRICS.splitlines():
        if not (line.startswith("vllm:") and 'engine="0"' in line):
            out.append(line)
            continue
        for e, values in engines.items():
            mine = line.replace('engine="0"', f'engine="{e}"')
            for prefix, v in values.items():
                if mine.startswith(prefix + "{"):
                    mine = mine.rsplit(" ", 1)[0] + f" {float(v)}"
                    break
            out.append(mine)
    return "\n".join(out) + "\n"


def moving(i: int, running: float = 3) -> dict[str, float]:
    return {RUN: running, WAIT: 0, GEN: 1000 + 40 * i, STEPS: 500 + 10 * i, KV: 0.1 + 0.01 * i}


FLAT = {RUN: 16, WAIT: 2, GEN: 800, STEPS: 400, KV: 0.4}


def dp_tracker(seconds: int, flat_from: int = 0, window: float = 10.0) -> EndpointTracker:
    """Engine 0 generating every second; engine 1 flat from ``flat_from`` on."""
    t = EndpointTracker(TARGET, Settings(interval_s=1.0, stall_window_s=window))
    for i in range(seconds + 1):
        one = FLAT if i >= flat_from else moving(i, 16)
        t.observe(scrape(100.0 + i, dp_body({"0": moving(i), "1": one})))
    return t


# ---- the samples --------------------------------------------------------------------------


def test_both_parsers_keep_each_engines_series():
    text = dp_body({"0": moving(1), "1": FLAT})
    for s in (parse_samples(text), parse_samples_fast(text)):
        assert s.engines == 2 and set(s.per_engine) == {"0", "1"}
        assert s.per_engine["1"][RUN] == 16 and s.per_engine["0"][GEN] == 1040
        assert s.get(RUN) == 19  # the sum the endpoint's figures keep
    plain = parse_samples("vllm:num_requests_running 2\nvllm:generation_tokens_total 5\n")
    assert plain.per_engine == {"0": {RUN: 2.0, GEN: 5.0}}  # no label: engine "0"


# ---- the direct tracker ---------------------------------------------------------------------


def test_one_engine_flat_while_the_other_generates_is_stalled_naming_it():
    v = dp_tracker(12).view
    assert v.state == c.STALLED, (v.state, v.reason)
    assert v.reason.startswith(
        "engine 1 (EngineCore_DP1): 16 requests running, 2 waiting, generation flat for 12 s"
    ), v.reason
    assert "engine 0 progressing (3 running)" in v.reason and v.reason.endswith("/health 200")
    e0, e1 = v.engines
    assert (e0.engine, e0.role, e0.state) == ("0", "EngineCore_DP0", c.BUSY)
    assert (e1.role, e1.state, e1.flat_s) == ("EngineCore_DP1", c.STALLED, 12.0)
    assert e0.generation_tps == pytest.approx(40.0) and e1.generation_tps == 0
    assert v.stalled_engines() == (e1,)
    # the endpoint's figures still sum (and the KV usage is the engines' mean)
    assert v.figures.running == 19 and v.figures.kv_usage == pytest.approx((0.22 + 0.4) / 2)


def test_below_the_window_it_is_busy_and_once_watches_on_then_settles_it_stalled():
    v = dp_tracker(4).view
    assert v.state == c.BUSY and v.progressing  # engine 0 moved: the old rule's "decided"
    assert undecided(v)  # engine 1 was not seen moving: --once must look longer
    (settled,) = settle_undecided((v,), 10.5, 10.0)
    assert settled.state == c.STALLED
    assert settled.reason.startswith("engine 1 (EngineCore_DP1): 16 requests running, ")
    assert "not seen moving in 10 s of observation" in settled.reason
    assert [e.state for e in settled.engines] == [c.BUSY, c.STALLED]
    recovered = dp_tracker(4, flat_from=99).view  # both engines moving
    assert recovered.state == c.BUSY and not undecided(recovered)


def test_a_stopped_engine_core_names_its_engine_and_the_others():
    v = dp_tracker(2).view
    local = c.LocalState(True, stopped=(c.ProcRole(42, "EngineCore_DP1"),))
    state, why = decide(scrape(200, dp_body({"0": moving(1), "1": FLAT})), local, None, False,
                        v.engines)  # fmt: skip
    assert state == c.STALLED
    assert why.startswith("engine 1 (EngineCore_DP1, pid 42) stopped (SIGSTOP or a debugger)")
    assert "; engine 0 progressing" in why
    t = dp_tracker(2)
    t.set_local(local)
    assert [e.state for e in t.view.engines] == [c.BUSY, c.STALLED]


def test_a_single_engine_server_reads_as_before():
    t = EndpointTracker(TARGET, Settings(interval_s=1.0, stall_window_s=10.0))
    for i in range(12):
        t.observe(scrape(100.0 + i, dp_body({"0": FLAT})))
    v = t.view
    assert v.state == c.STALLED and len(v.engines) == 1
    assert v.reason == (
        "16 requests running, 2 waiting, generation tokens flat for 11 s (engine steps and KV "
        "cache flat too); /health 200"
    )
    assert v.engines[0].role == "EngineCore" and v.stalled_engines() == ()
    assert engines_cell(v) == "" and engine_lines(v) == []


# ---- the canary, one per idle engine ------------------------------------------------------------


def test_idle_engines_get_a_canary_and_one_that_hangs_stalls_the_server():
    t = EndpointTracker(TARGET, Settings(interval_s=1.0))
    for i in range(3):
        t.observe(scrape(100.0 + i, dp_body({"0": moving(i), "1": {RUN: 0, WAIT: 0}})))
    v = t.view
    assert v.state == c.BUSY and canary_engines(v) == ["1"]  # engine 0's progress vouches
    hung = c.Canary(False, 3.0, "a 1-token completion did not return within 3 s")
    after = judge_engine_canaries(v, {"1": hung})
    assert after.state == c.STALLED
    assert after.reason.startswith(
        "engine 1 (EngineCore_DP1): canary: a 1-token completion did not return within 3 s, "
        "while its gauges say idle; engine 0 progressing"
    ), after.reason
    fine = judge_engine_canaries(v, {"1": c.Canary(True, 0.1, "returned")})
    assert fine.state == c.BUSY and fine.engines[1].canary.ok is True
    single = dp_tracker(0).view
    assert canary_engines(replace(single, engines=single.engines[:1])) == []  # one engine


# ---- Prometheus: the same rule on raw samples per engine ------------------------------------------


def test_the_prometheus_view_judges_each_engine_on_its_own():
    key = ("vllm", "127.0.0.1:9")
    target = prom.PromTarget("vllm", key[1], URL, "/metrics", (), "up", "", 100.0, 0.01, 1.0)
    ep = prom_view.PromEndpoint(target, Settings(interval_s=1.0, stall_window_s=10.0))
    for i in range(13):
        t = 100.0 + i
        one = moving(i) | {KV: 0.2}
        labelled = {
            "e.running": {"0": 3.0, "1": 16.0},
            "e.waiting": {"0": 0.0, "1": 2.0},
            "e.kv": {"0": 0.2, "1": 0.4},
            "e.gen_tps": {"0": 40.0, "1": 0.0},
        }
        d = prom.InstanceData({"up": 1.0, "running": 19.0, "sample_t": t}, labelled, ("m",), {})
        points = {
            "0": [(t, 3.0, one[GEN], one[STEPS], 0.2)],
            "1": [(t, 16.0, FLAT[GEN], FLAT[STEPS], FLAT[KV])],
        }
        v = ep.observe(prom_view.PromPoll(target, None, d, points, t))
    assert v.state == c.STALLED and v.reason.startswith("engine 1 (EngineCore_DP1): 16 requests")
    assert [e.state for e in v.engines] == [c.BUSY, c.STALLED]
    assert v.figures.kv_usage is None or v.figures.kv_usage <= 1


# ---- what is shown: the row, the drill-in, the document -------------------------------------------


def test_the_row_the_drill_in_and_the_document_show_each_engine():
    import jsonschema

    v = dp_tracker(12).view
    assert reason_cell(v, 200).startswith("1/2 engines stalled: engine 1 (EngineCore_DP1): ")
    lines = engine_lines(v)
    assert lines[0] == "engines (2, 1 stalled), each judged on its own:"
    assert lines[1].startswith("  engine 0 EngineCore_DP0") and " busy " in lines[1]
    assert lines[2].startswith("  engine 1 EngineCore_DP1") and "stalled" in lines[2]
    snap = c.FleetSnapshot(200.0, (v,), 1.0)
    doc = document(snap, stall_window_s=10.0, observed_s=12.0)
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).validate(doc)
    (e,) = doc["endpoints"]
    assert doc["schema"] == "opsctl.console/4" and doc["exit_code"] == 1
    assert [x["state"] for x in e["engines"]] == ["busy", "stalled"]
    assert e["engines"][1]["stalled_for_s"] == 12.0 and e["engines"][0]["stalled_for_s"] is None
    assert e["engines"][1]["requests_running"] == 16 and e["engines"][1]["role"] == "EngineCore_DP1"


# ---- the replica-imbalance finding ------------------------------------------------------------------


def _view(*engines: c.EngineView) -> c.EndpointView:
    return replace(dp_tracker(1).view, engines=engines)


def test_dp_imbalance_from_a_queue_on_one_engine_or_kv_caches_far_apart():
    e = c.EngineView
    queued = _view(e("0", "EngineCore_DP0", running=4, waiting=0, kv_usage=0.5),
                   e("1", "EngineCore_DP1", running=4, waiting=6, kv_usage=0.6))  # fmt: skip
    a = advisor.dp_imbalance(queued)
    assert a is not None and a.code == "dp_imbalance" and a.severity == "warning"
    assert "engine 1 has 6 requests waiting while engine 0 has none" in a.message
    assert a.figures["waiting_by_engine"] == {"0": 0, "1": 6} and a.next.startswith("opsctl status")
    kv = _view(e("0", "EngineCore_DP0", waiting=0, kv_usage=0.55),
               e("1", "EngineCore_DP1", waiting=0, kv_usage=0.91))  # fmt: skip
    a = advisor.dp_imbalance(kv)
    assert a is not None and "(36 points apart)" in a.message and a.figures["kv_gap"] == 0.36
    even = _view(e("0", "EngineCore_DP0", waiting=1, kv_usage=0.5),  # one waiting: a blip
                 e("1", "EngineCore_DP1", waiting=0, kv_usage=0.7))  # fmt: skip
    assert advisor.dp_imbalance(even) is None
    assert advisor.dp_imbalance(_view(e("0", "EngineCore", waiting=9, kv_usage=0.9))) is None
    assert advisor.DP_IMBALANCE in advisor.CODES


# ---- status against stand-ins --------------------------------------------------------------------------


class DpServer(StandInVllm):
    """Two engines: engine 0 generating at every scrape, engine 1 as ``ONE`` says; a
    completion sent to engine 1 (X-data-parallel-rank: 1) hangs while ``HANG`` is set."""

    ONE: dict[str, float] = FLAT
    HANG = threading.Event()
    scrapes = 0
    ranks: list[str | None] = []

    def metrics_text(self) -> str:
        """Engine 0 moving, engine 1 as ONE."""
        n = type(self).scrapes = type(self).scrapes + 1
        return dp_body({"0": moving(n), "1": type(self).ONE})

    def post(self, path: str, body: dict) -> bool:
        """Answer a 1-token completion; engine 1's hangs while HANG is set."""
        rank = self.headers.get("X-data-parallel-rank")
        type(self).ranks.append(rank)
        if rank == "1" and type(self).HANG.is_set():
            time.sleep(3)
        self._send(200, {"choices": [{"text": "k"}]})
        return True


def _status(one: dict, hang: bool, **options) -> dict:
    class Server(DpServer):
        ONE = one
        ranks: list = []

    Server.HANG.set() if hang else Server.HANG.clear()
    with serving(Server) as url:
        doc = status.run(UrlTarget(url), status.Options(local=False, **options)).to_dict()
    Server.HANG.clear()
    doc["_ranks"] = Server.ranks
    return doc


def test_status_watches_each_engine_and_names_the_flat_one():
    doc = _status(FLAT, False, stall_window=2.0, canary_timeout=1.0)
    assert doc["state"] == "stalled" and not doc["healthy"], doc["reason"]
    assert doc["reason"].startswith("engine 1 (EngineCore_DP1): 16 requests running"), doc
    assert [e["state"] for e in doc["engines"]] == ["busy", "stalled"]
    assert doc["_ranks"] == []  # no canary: engine 1 is busy, engine 0 progressing


def test_status_sends_each_idle_engine_its_own_canary():
    idle = {RUN: 0, WAIT: 0, GEN: 800, STEPS: 400, KV: 0.0}
    doc = _status(idle, True, stall_window=2.0, canary_timeout=1.0)
    assert doc["state"] == "stalled", doc["reason"]
    assert doc["reason"].startswith("engine 1 (EngineCore_DP1): canary: "), doc["reason"]
    assert doc["_ranks"] == ["1"]  # to engine 1 alone, by vLLM's header
    assert doc["engines"][1]["canary"]["ok"] is False and doc["canary"] is None
    ok = _status(idle, False, stall_window=2.0, canary_timeout=1.0)
    assert ok["state"] == "busy" and ok["engines"][1]["canary"]["ok"] is True, ok["reason"]


# ---- status: a timed-out answer says timed_out (issue 45 item 5) ------------------------------------


def test_a_server_that_accepts_and_never_answers_is_timed_out_and_unreachable():
    with socket.socket() as s:  # listens (the kernel accepts) and never answers: a stopped
        s.bind(("127.0.0.1", 0))  # API server
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        report = status.run(UrlTarget(url), status.Options(timeout=1, local=False))
    doc = report.to_dict()
    assert "timed out" in doc["error"] and doc["timed_out"] is True, doc
    assert doc["state"] == "unreachable" and status.exit_code(report) == 3
