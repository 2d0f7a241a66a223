"""The console via a real Prometheus against two real vLLM servers (tiny-llama, dummy
weights, started by opsctl's machinery; one module holds both under one engine lock).
Prometheus (Debian's package, scrape interval 1 s, /metrics and /health jobs) and the
direct source watch the same two servers:

- idle: the same figures;
- mid-load, the EngineCores stopped with requests running (and waiting) (tests/engine_cores.py):
  the same figures (running, waiting, KV usage, token totals), and both read 'stalled' (the
  stall rule on Prometheus's samples) while /health says 200;
- resumed and drained: the same final figures.

"The same" is checked twice: the console via Prometheus shows what the direct source shows,
and Prometheus's own record (its raw samples) agrees within one scrape interval: its first
scrape that started after the direct source read the figures stored them (unless that
scrape failed: under CPU load a 1 s scrape can time out, which stores only up 0; the
first successful one then must carry them), and no later successful scrape stored others.
Agreement lines (AGREE ...) are printed: run with -s to see them.

Then, on the same two servers (after the agreement test: its token totals count from the
engines' start), opsctl's stall alert end to end: Debian's `prometheus` scraping both every
second and loading the rules `opsctl rules --job vllm --for 15s` writes (the default
stall window, 10 s; the default --for 1m is proven in simulated time by promtool,
tests/unit/test_promtool_rules.py, and would hold this module a minute longer), Debian's `prometheus-alertmanager` routing to a webhook
receiver in this test (tests/alertmanager_fixture.py). Both servers serve streaming
completions with long max_tokens (closed loop). One server's EngineCore is SIGSTOPped with
requests in flight: exactly that server's VllmEngineStalled reaches the receiver (never the
other's, which keeps generating), the console via Prometheus shows the firing alert on that
endpoint (`console --once --json`), and SIGCONT resolves it (a resolved notification reaches
the receiver). The SIGSTOP-to-firing seconds are printed (-s): STALL-ALERT ...
(This was tests/e2e/test_alerts_e2e.py, merged here: one pair of engines, not two.)

Last, on the same two servers, the canary (issue 45 item 6): an engine stopped while idle
has 0 requests running and every series flat, /health 200: no rule over vLLM's own
metrics can see it. A real blackbox exporter (Debian's `prometheus-blackbox-exporter`,
tests/blackbox_fixture.py) runs the module `opsctl rules --blackbox-out` writes; its cost
is measured first on the idle server B (20 probes: vLLM's request and token counters and
the exporter's CPU time, printed: CANARY-COST ...). Prometheus scrapes both servers and
the exporter's canary job (every 3 s) and loads the rules (`--for 5s`). A's EngineCore is
SIGSTOPped while idle and sent 4 requests (they hang): VllmCanaryFailed fires for A (never
for B), `console --once --prometheus` says A is stalled (the canary's probes) and B ready,
and a second Prometheus without the canary job is read by `console --once` too: its own
canary, sent to each target it reads, finds A (CANARY-ALERT ... prints the timings).

Engines: two at once (the pool keeps one), both owned: their EngineCores are stopped."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from opsctl.console import discovery, targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.prometheus import PrometheusSource
from opsctl.domain import alert_rules
from opsctl.domain.metrics import GEN_TOKENS, KV_USAGE, PROMPT_TOKENS, RUNNING, WAITING
from tests.alertmanager_fixture import Webhook, running_alertmanager
from tests.blackbox_fixture import running_blackbox
from tests.conftest import two_engines
from tests.engine_cores import ClosedLoad, Cores, idle_thresholds, wait_fresh, wait_idle
from tests.prometheus_fixture import raw_history, running_prometheus
from tests.waiting import wait_until

pytestmark = pytest.mark.engine
SCRAPE_S = 1.0
N_CLIENTS, MAX_TOKENS, MAX_SEQS = 32, 120, 4  # per server: 4 run, the others wait
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": MAX_TOKENS, "ignore_eos": True}
FIELDS = ("running", "waiting", "kv_usage", "generation_tokens_total", "prompt_tokens_total")
# the same figures, as Prometheus stores them
METRICS = (RUNNING, WAITING, KV_USAGE, GEN_TOKENS, PROMPT_TOKENS)
STREAM = {**BODY, "max_tokens": 400, "stream": True}  # the alert test's load
ALERT = "VllmEngineStalled"
FOR_S = 15.0  # the alert test's --for: a busy server would need 25 s of flat generation


@pytest.fixture(scope="module")
def engines():
    kw = dict(load_format="dummy", max_model_len=512, max_num_seqs=MAX_SEQS)
    with two_engines(kw) as (a, b):
        yield a, b


def _views(src) -> dict:
    return {v.target.url: v for v in src.collect().endpoints}


def _figs(view) -> tuple:
    return tuple(getattr(view.figures, f) for f in FIELDS)


def _states(*sources) -> list[dict[str, str]]:
    return [{u: v.state for u, v in _views(s).items()} for s in sources]


class _Since:
    """Per endpoint: its current figures, when a scrape first carried them, and when this
    test first saw them; and the newest scrape time (last_ok_at) seen at all."""

    def __init__(self) -> None:
        self.at: dict[str, tuple[tuple, float, float]] = {}
        self.newest: dict[str, float] = {}

    def see(self, src) -> None:
        now = time.time()
        for u, v in _views(src).items():
            if v.last_ok_at is None:
                continue
            self.newest[u] = v.last_ok_at
            if self.at.get(u, (None,))[0] != _figs(v):
                self.at[u] = (_figs(v), v.last_ok_at, now)

    def settled(self, u: str, since: float, hold: float) -> bool:
        """A scrape that finished after ``since`` read the figures, and scrapes at least
        ``hold`` seconds apart read the same (a source whose scrapes all failed since
        keeps showing old figures: those are not settled)."""
        newest = self.newest.get(u)
        return (
            u in self.at
            and newest is not None
            and newest >= since
            and (newest - self.at[u][1] >= hold)
        )


def _scrapes_after(server, url: str, since: float) -> list[tuple[float, tuple | None]]:
    """Prometheus's scrape attempts of ``url`` that started after ``since``, in order:
    (scrape time, the FIELDS it stored, or None where the scrape failed)."""
    hist = raw_history(server, urlsplit(url).netloc, METRICS, time.time() - since + 5)
    return [(t, row) for t, row in sorted(hist.items()) if t > since]


def converge(urls, via_prom, direct, server, what: str) -> dict[str, tuple]:
    """Once the direct figures stop changing (scrapes two intervals apart, the newer one
    after this call, read the same) and the console via Prometheus shows the same from a
    Prometheus scrape after this call: Prometheus's own record (raw samples) agrees with them.
    The first Prometheus scrape that started after the direct source had read the figures
    carried them (or failed: a timed-out scrape stores nothing but up 0), and so did every
    later successful scrape. Returns per endpoint: how long after the direct read
    Prometheus first stored them, how many of its scrapes failed before, how much later
    the console showed them, the figures."""
    d, p = _Since(), _Since()
    since = time.time()

    def done() -> bool:
        d.see(direct)
        p.see(via_prom)
        return all(
            d.settled(u, since, 2 * SCRAPE_S)
            and p.settled(u, since, 0.0)
            and p.at[u][0] == d.at[u][0]
            for u in urls
        )

    wait_until(done, 120, f"equal figures ({what})", lambda: (d.at, p.at))
    out = {}
    for u in urls:
        figs, d_t, d_seen = d.at[u]

        def stored(u: str = u, d_t: float = d_t) -> list:
            """The scrapes after the direct read, once one of them succeeded."""
            after = _scrapes_after(server, u, d_t)
            return after if any(r is not None for _, r in after) else []

        after = wait_until(
            stored, 60, f"a successful Prometheus scrape of {u} after the direct read"
        )
        failed = 0
        while after[failed][1] is None:
            failed += 1
        first_t = after[failed][0]
        times = [d_t, *(t for t, _ in after)]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        print(f"AGREE {what} {u}: Prometheus stored them {first_t - d_t:+.2f} s after the direct "
              f"read ({failed} failed scrapes before, longest gap between scrapes {max(gaps):.2f} s), "
              f"console {p.at[u][2] - d_seen:+.2f} s; "
              + ", ".join(f"{f}={x}" for f, x in zip(FIELDS, figs, strict=True)))  # fmt: skip
        wrong = [(t, r) for t, r in after if r is not None and r != figs]
        assert not wrong, (u, "Prometheus stored other figures after the direct read", figs, wrong)
        out[u] = (first_t - d_t, failed, p.at[u][2] - d_seen, figs)
    return out


def _run_until_queued(
    cores: Cores, api_pids: list[int], idle: list[float], direct, urls: list[str], failed: list
) -> None:
    """Once the API servers went idle (every request admitted and handed to its stopped
    core), slice the cores until the direct source reads requests running on both
    servers (the cores stay stopped; each core is sliced only until its own server reads
    that). Waiting only when the API server had handed every request over: one that
    trickled them in kept a core at running 4 / waiting 0 until it had run them all."""
    wait_idle(api_pids, 120, idle)

    def figs() -> list:
        views = _views(direct)
        return [views[u].figures if u in views else None for u in urls]

    def pending() -> list[int]:
        return [p for p, f in zip(cores.pids, figs(), strict=True) if not (f and f.running)]

    def settle() -> None:
        for u in urls:
            wait_fresh(lambda u=u: direct.tracker(u).last_ok_at, 90, u)

    cores.run_until(
        pending,
        lambda: [f and (f.running, f.waiting, f.generation_tokens_total) for f in figs()],
        settle,
        timeout=240,
        show=lambda: (figs(), failed[:3]),
    )


def test_prometheus_and_direct_agree_on_two_real_servers(engines):
    urls = [e.url for e in engines]
    core_pids = [
        next(p.pid for p in discovery.process_roles(e.pid) if p.role == "EngineCore")
        for e in engines
    ]
    settings = Settings(interval_s=0.25, stall_window_s=3.0)
    with running_prometheus(urls, interval=SCRAPE_S, up=True) as server:
        via_prom = PrometheusSource(server.url, job="vllm", settings=settings, timeout=5.0)
        direct = DirectScrapeSource(
            targets.from_urls(urls), discover=False, settings=settings, timeout=5.0
        )
        via_prom.start()
        direct.start()
        cores = Cores(core_pids)
        load = ClosedLoad(urls, N_CLIENTS, BODY)
        try:
            wait_until(lambda: _states(via_prom, direct) == [dict.fromkeys(urls, "ready")] * 2,
                       60, "both ready in both sources", lambda: _states(via_prom, direct))  # fmt: skip
            assert via_prom.collect().hint is None  # /health is scraped too
            converge(urls, via_prom, direct, server, "idle")
            api_pids = [e.pid for e in engines]
            idle = idle_thresholds(api_pids)  # both sources scraping, no requests
            print(f"IDLE API servers busy above {idle} s per 1 s window")
            cores.stop()
            load.start()
            _run_until_queued(cores, api_pids, idle, direct, urls, load.failed)
            frozen = converge(urls, via_prom, direct, server, "stopped mid-load")
            for u, (*_, figs) in frozen.items():
                f = dict(zip(FIELDS, figs, strict=True))
                assert f["running"] > 0 and f["kv_usage"] > 0, (u, f)
            wait_until(lambda: _states(via_prom, direct) == [dict.fromkeys(urls, "stalled")] * 2,
                       30, "stalled in both", lambda: _states(via_prom, direct))  # fmt: skip
            assert {v.health_status for v in _views(via_prom).values()} == {200}
            cores.resume()
            load.stop(600)
            assert load.failed == [] and all(load.done.values()), load.done
            drained = converge(urls, via_prom, direct, server, "drained")
            for u, (*_, figs) in drained.items():  # every answer carried its MAX_TOKENS
                f = dict(zip(FIELDS, figs, strict=True))
                assert f["generation_tokens_total"] == load.done[u] * MAX_TOKENS, (u, f, load.done)
            wait_until(lambda: _states(via_prom) == [dict.fromkeys(urls, "ready")], 30, "ready")
        finally:
            load.halt()
            if cores.stopped:
                cores.resume()
            via_prom.close()
            direct.close()


def running_now(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


def freeze_with_requests_running(core: int, url: str, timeout: float = 120.0) -> float:
    """SIGSTOP the EngineCore while requests run on it; the time of the stop. The load's
    streams start together and end at the same step, so a stop can land in the moment
    between two batches (nothing running: an idle server, not a stalled one); then the
    core goes on and is stopped again once requests run."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(core, signal.SIGSTOP)
        stopped_at = time.time()
        if running_now(url) > 0:  # the frozen core left requests running
            return stopped_at
        os.kill(core, signal.SIGCONT)
        assert time.monotonic() < deadline, f"no stop with requests running in {timeout:g} s"
        wait_until(lambda: running_now(url) > 0, max(1.0, deadline - time.monotonic()),
                   "requests running again")  # fmt: skip


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
        [sys.executable, "-m", "opsctl", "rules", "--job", "vllm", "--for", f"{FOR_S:g}s",
         "--out", str(rules)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    core_a = next(p.pid for p in discovery.process_roles(a.pid) if p.role == "EngineCore")
    for_s = FOR_S
    with (
        Webhook() as hook,
        running_alertmanager(hook.url) as am,
        running_prometheus(
            [a.url, b.url], interval=SCRAPE_S, up=True, rule_files=[str(rules)],
            alertmanager=am.url,
        ) as prom,
    ):  # fmt: skip
        load = ClosedLoad([a.url, b.url], 2 * MAX_SEQS, STREAM).start()
        stopped_at = None
        try:
            wait_until(lambda: running_now(a.url) > 0 and running_now(b.url) > 0, 120,
                       "requests running on both servers")  # fmt: skip
            stopped_at = freeze_with_requests_running(core_a, a.url)

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
                f"\nSTALL-ALERT rules (stall window {alert_rules.STALL_WINDOW_S:g} s, "
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
            assert running_now(b.url) >= 0 and load.done[b.url] > 0  # B kept answering
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


# ---- the canary: an engine stopped while idle, behind Prometheus and the blackbox exporter ----

CANARY_ALERT = "VllmCanaryFailed"
CANARY_S = 3.0  # the canary job's scrape interval and timeout (the exporter probes 2.5 s)
CANARY_FOR = "5s"
COST_PROBES = 20
COUNTERS = ("vllm:request_success_total", PROMPT_TOKENS, GEN_TOKENS)


def counters(url: str) -> tuple[float, ...]:
    """vLLM's finished requests, prompt and generated tokens (each summed over its series)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    sums = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return tuple(sums[m] for m in COUNTERS)


def canary_cost(exporter, url: str, n: int) -> dict:
    """``n`` probes of the idle server ``url`` through the exporter: what each cost vLLM
    (requests, prompt and generated tokens, from its counters) and the exporter (CPU)."""
    import psutil

    proc = psutil.Process(exporter.proc.pid)
    before, cpu0 = counters(url), sum(proc.cpu_times()[:2])
    took = []
    for _ in range(n):
        got = exporter.probe(f"{url}/v1/completions")
        assert got["probe_success"] == 1, got
        took.append(got["probe_duration_seconds"])
    cpu = sum(proc.cpu_times()[:2]) - cpu0
    after = wait_until(
        lambda: (c := counters(url))[0] - before[0] >= n and c, 60, "the probes counted"
    )
    req, prompt, gen = (x - y for x, y in zip(after, before, strict=True))
    return {"requests": req / n, "prompt_tokens": prompt / n, "generation_tokens": gen / n,
            "exporter_cpu_ms": 1000 * cpu / n, "probe_s_mean": sum(took) / n,
            "probe_s_max": max(took)}  # fmt: skip


def prom_value(server, query: str) -> dict[str, float]:
    r = httpx.get(f"{server.url}/api/v1/query", params={"query": query}, timeout=10).json()
    return {x["metric"].get("instance", ""): float(x["value"][1]) for x in r["data"]["result"]}


def hang_requests(url: str, n: int) -> tuple[list, list]:
    """``n`` completions to ``url`` in threads (they wait for the stopped core): threads, codes."""
    import threading

    codes: list = []

    def one() -> None:
        try:
            body = {**BODY, "max_tokens": 4}
            codes.append(httpx.post(f"{url}/v1/completions", json=body, timeout=600).status_code)
        except httpx.HTTPError as exc:
            codes.append(repr(exc))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, codes


def test_engine_stopped_while_idle_fires_the_canary_alert_and_console_once_is_not_ready(
    engines, tmp_path
):
    a, b = engines
    inst_a, inst_b = urlsplit(a.url).netloc, urlsplit(b.url).netloc
    rules, bb = tmp_path / "opsctl-rules.yml", tmp_path / "blackbox.yml"
    cmd = [sys.executable, "-m", "opsctl", "rules", "--job", "vllm", "--for", CANARY_FOR,
           "--out", str(rules), "--blackbox-out", str(bb)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    core_a = next(p.pid for p in discovery.process_roles(a.pid) if p.role == "EngineCore")
    wait_until(lambda: running_now(a.url) == 0 and running_now(b.url) == 0, 120, "both idle")
    with running_blackbox(bb) as exporter:
        cost = canary_cost(exporter, b.url, COST_PROBES)
        print(f"\nCANARY-COST per probe ({COST_PROBES} probes of an idle tiny-llama): "
              + ", ".join(f"{k}={v:.3g}" for k, v in cost.items()))  # fmt: skip
        assert (cost["requests"], cost["generation_tokens"]) == (1.0, 1.0), cost
        with (
            running_prometheus([a.url, b.url], interval=SCRAPE_S, up=True,
                               rule_files=[str(rules)], canary=exporter.address,
                               canary_interval=CANARY_S) as prom,
            running_prometheus([a.url, b.url], interval=SCRAPE_S, up=True) as plain,
        ):  # fmt: skip
            ok = f'probe_success{{job="{alert_rules.CANARY_JOB}"}}'
            wait_until(lambda: prom_value(prom, ok) == {inst_a: 1.0, inst_b: 1.0}, 60,
                       "both servers' canary probes succeed", lambda: prom_value(prom, ok))  # fmt: skip
            assert prom_alerts(prom, CANARY_ALERT) == {}
            os.kill(core_a, signal.SIGSTOP)
            stopped_at = time.time()
            threads, codes = [], []
            try:
                threads, codes = hang_requests(a.url, 4)
                firing = wait_until(lambda: prom_alerts(prom, CANARY_ALERT, "firing").get(inst_a),
                                    120, f"{CANARY_ALERT} firing for {inst_a}",
                                    lambda: (prom.alerts(), prom_value(prom, ok)))  # fmt: skip
                fired_at = time.time()
                assert firing["labels"]["severity"] == "critical"
                assert running_now(a.url) == 0  # the gauges say idle: only the canary tells
                t0 = time.time()
                doc = console_once(prom.url)
                took = time.time() - t0
                rows = {urlsplit(e["url"]).netloc: e for e in doc["endpoints"]}
                assert rows[inst_a]["state"] == "stalled", rows[inst_a]
                assert "blackbox canary" in rows[inst_a]["reason"], rows[inst_a]
                assert CANARY_ALERT in [x["alertname"] for x in rows[inst_a]["alerts"]]
                assert rows[inst_b]["state"] == "ready", rows[inst_b]
                assert doc["exit_code"] == 1
                # without the canary job: console --once's own canary to each target it reads
                t1 = time.time()
                own = {urlsplit(e["url"]).netloc: e for e in console_once(plain.url)["endpoints"]}
                took_own = time.time() - t1
                assert own[inst_a]["state"] == "stalled", own[inst_a]
                assert "1-token completion did not return" in own[inst_a]["reason"], own[inst_a]
                assert own[inst_b]["state"] == "ready", own[inst_b]
                print(f"CANARY-ALERT canary job every {CANARY_S:g} s, --for {CANARY_FOR}: "
                      f"SIGSTOP->firing {fired_at - stopped_at:.1f} s; console --once via the "
                      f"probes {took:.1f} s, via its own canary {took_own:.1f} s")  # fmt: skip
            finally:
                os.kill(core_a, signal.SIGCONT)
            for t in threads:
                t.join(300)
            assert codes == [200] * 4, codes  # the hung requests finished once resumed
            wait_until(lambda: prom_value(prom, ok) == {inst_a: 1.0, inst_b: 1.0}, 60,
                       "A's canary succeeds again", lambda: prom_value(prom, ok))  # fmt: skip
            q = f'ALERTS{{alertname="{CANARY_ALERT}",instance="{inst_b}"}}[30m]'
            hist = httpx.get(f"{prom.url}/api/v1/query", params={"query": q}, timeout=10).json()
            assert hist["data"]["result"] == []  # never B's
