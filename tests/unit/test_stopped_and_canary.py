"""A stopped engine is never ready (issue 35 item 4): the domain's rule for stopped
processes and for the canary, and the canary against a stand-in whose API answers
/health 200 and /metrics but never finishes a completion (the real engine's case is
tests/e2e/test_console_e2e.py::test_an_engine_stopped_while_idle_is_never_ready)."""

from __future__ import annotations

import re
import threading
import time

from opsctl.checks import status
from opsctl.checks.target import UrlTarget
from opsctl.collectors.canary import send
from opsctl.console import judge as c
from opsctl.console.judge_state import decide, judge_canary
from tests.standins.base import StandInVllm, serving
from tests.unit.test_console_domain import body, scrape


def test_a_stopped_process_makes_an_answering_server_stalled():
    healthy = scrape(0, body())
    stopped = c.LocalState(True, stopped=(c.ProcRole(42, "EngineCore"),))
    state, why = decide(healthy, stopped, None, False)
    assert state == c.STALLED
    assert why.startswith("EngineCore (pid 42) stopped (SIGSTOP or a debugger)")
    assert why.endswith("/health 200")
    assert decide(healthy, c.LocalState(True), None, False)[0] == c.READY


def test_the_canary_turns_ready_or_busy_into_stalled_only_when_it_hung():
    for state in (c.READY, c.BUSY):
        got, why = judge_canary(state, None, False, "no answer within 3 s")
        assert got == c.STALLED and why.startswith("canary: no answer within 3 s")
        assert judge_canary(state, None, True, "fine") == (state, None)
        assert judge_canary(state, None, None, "HTTP 404") == (state, None)  # inconclusive
    assert judge_canary(c.DEAD, "gone", False, "x") == (c.DEAD, "gone")


class Hanging(StandInVllm):
    """Answers everything at once but /v1/completions, which it holds until released."""

    release = threading.Event()

    def post(self, path: str, body: dict) -> bool:
        """Hold every POST until the test releases it, then answer one token."""
        self.release.wait(30)
        self._send(200, {"choices": [{"text": "k"}]})
        return True


def test_status_of_a_server_whose_completions_hang_is_stalled():
    Hanging.release.clear()
    try:
        with serving(Hanging) as url:
            t0 = time.monotonic()
            doc = status.run(UrlTarget(url), status.Options(canary_timeout=1.0)).to_dict()
            assert doc["state"] == "stalled" and not doc["healthy"], doc
            assert doc["health_status"] == 200 and doc["canary"]["ok"] is False
            assert time.monotonic() - t0 < 10
            assert (
                status.exit_code(status.run(UrlTarget(url), status.Options(canary_timeout=1.0)))
                == 1
            )
            Hanging.release.set()
            ok = send(url, "stand-in", 5.0)
            assert ok.ok is True and "returned" in ok.detail
            off = status.run(UrlTarget(url), status.Options(canary_timeout=None)).to_dict()
            assert off["state"] == "ready" and off["canary"] is None  # --no-canary
    finally:
        Hanging.release.set()


def busy(running: int, gen=lambda n: 40, steps=lambda n: 20, kv=lambda n: 0.3):
    """A stand-in whose completions hang (:class:`Hanging`) and whose /metrics show
    ``running`` requests and the generation, step and KV series as functions of the
    scrape's number ``n`` (1, 2, ...)."""

    class Busy(Hanging):
        scrapes = 0

        def metrics_text(self) -> str:
            """The gauges and counters of scrape ``n``."""
            n = type(self).scrapes = type(self).scrapes + 1
            return (
                f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
                f"vllm:generation_tokens_total {gen(n)}\n"
                f"vllm:iteration_tokens_total_count {steps(n)}\n"
                f"vllm:kv_cache_usage_perc {kv(n)}\n"
            )

    return Busy


def status_of(standin, **options) -> tuple[dict, float]:
    """``status.run`` on ``standin`` (its completions released after): (document, seconds)."""
    Hanging.release.clear()
    try:
        with serving(standin) as url:
            t0 = time.monotonic()
            doc = status.run(UrlTarget(url), status.Options(**options)).to_dict()
            return doc, time.monotonic() - t0
    finally:
        Hanging.release.set()


def test_a_busy_server_whose_generation_moves_gets_no_canary():
    """Four requests running, the generation counter 7 tokens further at each scrape
    (under load a canary may wait longer than its deadline)."""
    doc, _ = status_of(busy(4, gen=lambda n: 7 * n), canary_timeout=1.0)
    assert doc["state"] == "busy" and doc["healthy"] and doc["canary"] is None, doc


def test_a_long_prefill_fills_the_kv_cache_and_gets_no_canary():
    """A long prefill as vLLM 0.32 publishes it (measured, tests/e2e/test_prefill_e2e.py):
    no token and no engine step counted until it ends, the KV cache fuller at every
    scrape. status judges progress as the console does, so it is busy, not stalled, and
    gets no canary (which would wait behind the prefill's token budget)."""
    doc, _ = status_of(busy(1, gen=lambda n: 0, steps=lambda n: 0, kv=lambda n: 0.0078 * n),
                       canary_timeout=1.0)  # fmt: skip
    assert doc["state"] == "busy" and doc["healthy"] and doc["canary"] is None, doc


def test_a_busy_server_flat_for_the_stall_window_is_stalled_without_a_canary():
    """status judges a busy server by the console's rule: watched a scrape a second, flat
    for the whole stall window = stalled; no canary (it would wait behind the running
    requests)."""
    doc, took = status_of(busy(2), canary_timeout=1.0, stall_window=2.0)
    assert doc["state"] == "stalled" and doc["canary"] is None, doc
    assert "2 requests running" in doc["reason"] and "(stall window 2 s)" in doc["reason"]
    # flat for the window at least: a look slowed by busy cores saw it flat for longer
    flat = re.search(r"flat for (\d+) s", doc["reason"])
    assert flat and 2 <= int(flat.group(1)) <= took + 1, doc["reason"]
    assert 2.0 <= took < 30, took  # the whole window, not one look
