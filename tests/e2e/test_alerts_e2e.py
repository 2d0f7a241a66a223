"""opsctl's stall alert end to end with the real parts: two real vLLM servers (tiny-llama,
dummy weights, single process: the EngineCore holds the model), Debian's `prometheus`
scraping both every second and loading the rules `opsctl rules --job vllm` writes at its
DEFAULT settings (--for 1m; stall window 10 s), Debian's `prometheus-alertmanager` routing
to a webhook receiver in this test (tests/alertmanager_fixture.py).

Both servers serve streaming completions with long max_tokens (closed loop: the engines never
run out of work). One server's EngineCore is SIGSTOPped with requests in flight: exactly that
server's VllmEngineStalled reaches the receiver (never the other's, which keeps generating),
the console via Prometheus shows the firing alert on that endpoint (`console --once --json`),
and SIGCONT resolves it (a resolved notification reaches the receiver). The SIGSTOP-to-firing
seconds (at Prometheus, and at the receiver) are printed (run with -s): STALL-ALERT ...

Engines: two at once (the pool keeps one), both owned: one is frozen by SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from opsctl.console import discovery
from opsctl.domain import alert_rules
from tests.alertmanager_fixture import Webhook, running_alertmanager
from tests.bare_vllm import _engine_lock, no_inner_lock
from tests.conftest import running_engine
from tests.engine_cores import ClosedLoad
from tests.prometheus_fixture import running_prometheus
from tests.waiting import wait_until

pytestmark = pytest.mark.engine
SCRAPE_S = 1.0
MAX_SEQS = 4
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 400, "ignore_eos": True,
        "stream": True}  # fmt: skip
ALERT = "VllmEngineStalled"


@pytest.fixture(scope="module")
def engines():
    kw = dict(load_format="dummy", max_model_len=512, max_num_seqs=MAX_SEQS)
    with (
        _engine_lock(),
        no_inner_lock(),
        running_engine("tiny-llama", **kw) as a,
        running_engine("tiny-llama", **kw) as b,
    ):
        yield a, b


def running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


def prom_alerts(server, name: str, state: str | None = None) -> dict[str, dict]:
    return {
        a["labels"]["instance"]: a
        for a in server.alerts()
        if a["labels"].get("alertname") == name and state in (None, a["state"])
    }


def console_once(prom_url: str) -> dict:
    cmd = [sys.executable, "-m", "opsctl", "console", "--prometheus", prom_url, "--job", "vllm",
           "--once", "--json"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_sigstop_fires_exactly_that_servers_stall_alert_and_sigcont_resolves_it(engines, tmp_path):
    a, b = engines
    inst_a, inst_b = urlsplit(a.url).netloc, urlsplit(b.url).netloc
    rules = tmp_path / "opsctl-rules.yml"
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "rules", "--job", "vllm", "--out", str(rules)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    core_a = next(p.pid for p in discovery.process_roles(a.pid) if p.role == "EngineCore")
    for_s = alert_rules.DEFAULT_FOR_S
    with (
        Webhook() as hook,
        running_alertmanager(hook.url) as am,
        running_prometheus(
            [a.url, b.url], interval=SCRAPE_S, up=True, rule_files=[str(rules)],
            alertmanager=am.url,
        ) as prom,
    ):  # fmt: skip
        load = ClosedLoad([a.url, b.url], 2 * MAX_SEQS, BODY).start()
        stopped_at = None
        try:
            wait_until(lambda: running(a.url) > 0 and running(b.url) > 0, 120,
                       "requests running on both servers")  # fmt: skip
            os.kill(core_a, signal.SIGSTOP)
            stopped_at = time.time()
            assert running(a.url) > 0  # the frozen core left requests running

            # pending once the stall window passed, firing after --for
            pending = wait_until(lambda: prom_alerts(prom, ALERT).get(inst_a), 120,
                                 f"{ALERT} pending for {inst_a}", lambda: prom.alerts())  # fmt: skip
            firing = wait_until(lambda: prom_alerts(prom, ALERT, "firing").get(inst_a),
                                for_s + 120, f"{ALERT} firing for {inst_a}",
                                lambda: prom.alerts())  # fmt: skip
            fired_at = time.time()
            got = wait_until(lambda: hook.received(ALERT, "firing", instance=inst_a), 120,
                             "the firing notification at the receiver",
                             lambda: (hook.notifications, am.log_text()))  # fmt: skip
            received_at = got[0][0]
            print(
                f"\nSTALL-ALERT default rules (stall window {alert_rules.STALL_WINDOW_S:g} s, "
                f"--for {for_s:g} s), scrape/evaluation {SCRAPE_S:g} s: SIGSTOP->pending "
                f"(Prometheus activeAt {pending['activeAt']}), SIGSTOP->firing seen "
                f"{fired_at - stopped_at:.1f} s, SIGSTOP->receiver {received_at - stopped_at:.1f} s"
            )
            assert firing["labels"]["severity"] == "critical"
            assert inst_a in firing["annotations"]["runbook"]
            assert received_at - stopped_at >= alert_rules.STALL_WINDOW_S + for_s - 2 * SCRAPE_S

            # the console tells the same story: the alert on A's row, none on B's
            doc = wait_until(
                lambda: (d := console_once(prom.url))
                and [x["alertname"] for e in d["endpoints"] for x in e["alerts"]] == [ALERT]
                and d,
                120, "the alert on the console's row", lambda: console_once(prom.url),
            )  # fmt: skip
            rows = {urlsplit(e["url"]).netloc: e for e in doc["endpoints"]}
            assert rows[inst_a]["state"] == "stalled", rows[inst_a]
            assert [x["alertname"] for x in rows[inst_a]["alerts"]] == [ALERT]
            assert rows[inst_b]["alerts"] == [], rows[inst_b]
            assert running(b.url) >= 0 and load.done[b.url] > 0  # B kept answering
        finally:
            if stopped_at is not None:
                os.kill(core_a, signal.SIGCONT)
            resumed_at = time.time()
        resolved = wait_until(lambda: hook.received(ALERT, "resolved", instance=inst_a), 180,
                              "the resolved notification at the receiver",
                              lambda: hook.notifications)  # fmt: skip
        print(f"STALL-ALERT SIGCONT->resolved at the receiver {resolved[0][0] - resumed_at:.1f} s")
        load.stop(600)
        # never B's: not at the receiver, not in Prometheus's ALERTS history
        assert hook.received(ALERT, "firing", instance=inst_b) == []
        q = f'ALERTS{{alertname="{ALERT}",instance="{inst_b}"}}[30m]'
        hist = httpx.get(f"{prom.url}/api/v1/query", params={"query": q}, timeout=10).json()
        assert hist["data"]["result"] == []
        assert load.failed == [], load.failed[:3]
