"""The one DP=2 engine of the tier: first read as it is, then one data-parallel engine
stalled among healthy ones, then killed (issue 44). tiny-llama, real seeded weights,
``--data-parallel-size 2`` (EngineCore_DP0/DP1, a DPCoordinator),
max_model_len 512 and 16 sequences per engine so requests last, and the hang knob armed
(OPSCTL_HANG_STEP=FILE: ``FILE.dp1`` blocks EngineCore_DP1's step alone). Requests are
routed with vLLM's ``X-data-parallel-rank`` header: 16 closed-loop clients on engine 1,
one request every 0.25 s on engine 0 (the summed counters keep moving, which read busy
for 45 s before: the case the issue measured). A real Prometheus (1 s scrapes) loads the
rules of ``opsctl rules --job vllm --for 1s``.

(a) EngineCore_DP1 SIGSTOPped with requests running on it: ``status``, direct
    ``console --once`` and ``console --once --prometheus`` say stalled naming engine 1,
    exit 1; VllmEngineStalled fires for engine="1" only; SIGCONT: healthy again.
(b) EngineCore_DP1's step hung by the knob with requests on it (no process stopped):
    only its metrics tell: the same three say stalled naming engine 1, and the alert.
(c) EngineCore_DP1 hung while idle (its gauges read 0 running): the canary sent to it
    alone (``X-data-parallel-rank: 1``) by ``status`` and ``console --once`` names it.
(d) SIGKILL of EngineCore_DP1 (the server is torn down about 5 s later on 0.32): the
    direct console says dead naming EngineCore_DP1 from the poll after the kill, never
    busy or ready again; what each source said meanwhile is printed (-s): DP-KILL ...
    Then serve's first-death verdict (the same EngineServer call its stopped event makes),
    `status`, the console's dead reason and `runs bundle` name EngineCore_DP1 as the rank
    that died first, SIGKILL, and what the other ranks did (item 5; was
    test_rank_death_e2e.py's own `serve --dp 2`).

Before (a), read as it is (items 2 and 6; they were the pooled `dp2` engine's modules):
the process tree, the patch ledger per rank, `runs bundle`, `console --once --json` and
discovery name every rank; `diag invariance URL` runs in one engine (vLLM's
X-data-parallel-rank header, seen in the per-engine counters) and `certify URL` judges
the server truly (the patch ledger fails for the armed hang knob alone).

Engines: one DP=2 start (its own pooled spec, ``dp2-stall``: the knob and the frozen,
hung and killed engine are this module's alone; (d) kills it, so it runs last)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from opsctl.checks.target import EngineSpec
from opsctl.collectors.ledger import read_records
from opsctl.console import discovery, targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.prometheus import PrometheusSource
from tests.conftest import OPSCTL
from tests.e2e import rank_views
from tests.engine_cores import Cores
from tests.prometheus_fixture import running_prometheus
from tests.unit.test_console_collect import validate
from tests.waiting import wait_until

POOL = "dp2-stall"
pytestmark = [pytest.mark.engine, pytest.mark.pool(POOL)]
RUNNING = "vllm:num_requests_running"
GEN = "vllm:generation_tokens_total"
LONG = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 240, "ignore_eos": True}
SHORT = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 24, "ignore_eos": True}
ALERT = "VllmEngineStalled"
RANKS = ["APIServer", "DPCoordinator", "EngineCore_DP0", "Worker_DP0", "EngineCore_DP1",
         "Worker_DP1"]  # fmt: skip


# ---- the engine, Prometheus and the load --------------------------------------------------------


@pytest.fixture(scope="module")
def hold(tmp_path_factory):
    """The knob's file: FILE.dp1 holds EngineCore_DP1's step while it exists."""
    return tmp_path_factory.mktemp("dp-hang") / "hold"


@pytest.fixture(scope="module")
def server(engine_pool, hold):
    from engine_patches import knobs

    spec = EngineSpec(
        "tiny-llama", dp=2, single_process=False, max_model_len=512,
        max_num_seqs=16, knobs=((knobs.HANG_STEP, str(hold)),), timeout=400.0,
    )  # fmt: skip
    live = engine_pool.engine(POOL, spec)
    yield live
    dp1_of(hold).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def prom(server, tmp_path_factory):
    rules = tmp_path_factory.mktemp("rules") / "opsctl-rules.yml"
    r = subprocess.run([*OPSCTL, "rules", "--job", "vllm", "--for", "1s", "--out", str(rules)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with running_prometheus([server.url], interval=1.0, up=True, rule_files=[str(rules)]) as p:
        yield p


def dp1_of(hold):
    """The knob's file for EngineCore_DP1 alone: FILE.dp1."""
    return hold.with_name(hold.name + ".dp1")


def core_pid(live, role: str = "EngineCore_DP1") -> int:
    roles = discovery.process_roles(live.server.pid)
    return next(p.pid for p in roles if p.role == role)


def gauge(url: str, name: str, engine: str) -> float:
    """One series of one engine as /metrics says it now (summed over its models)."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'engine="{engine}"' in line
    )


class Pinned:
    """Requests pinned to one engine with ``X-data-parallel-rank``: ``clients`` closed-loop
    clients, or (``every``) one new request every ``every`` seconds, until halted."""

    def __init__(self, url: str, rank: int, body: dict, clients: int = 0, every: float = 0):
        self.url, self.headers, self.body = url, {"X-data-parallel-rank": str(rank)}, body
        self.clients, self.every = clients, every
        self.answers: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def _one(self) -> None:
        try:
            with httpx.Client(timeout=600) as c:
                r = c.post(f"{self.url}/v1/completions", json=self.body, headers=self.headers)
            self.answers.append(r.status_code)
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))

    def _closed(self) -> None:
        while not self.stop.is_set():
            self._one()

    def _paced(self) -> None:
        while not self.stop.wait(self.every):  # the workload's pace, not a wait for a state
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self.threads.append(t)

    def start(self) -> Pinned:
        loops = [self._paced] if self.every else [self._closed] * self.clients
        for loop in loops:
            t = threading.Thread(target=loop, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def halt(self, timeout: float = 600) -> None:
        """No new requests; wait (deadline) for the ones in flight to answer."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        # the loops first (threads[:len(loops)]): a paced loop may start one last request
        # after stop is set, so the list is read again once they have ended
        for t in self.threads[: 1 if self.every else self.clients]:
            t.join(max(0.0, deadline - time.monotonic()))
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "requests still in flight"


@pytest.fixture
def load(server):
    """16 closed-loop clients on engine 1 and one request every 0.25 s on engine 0."""
    one = Pinned(server.url, 1, LONG, clients=16).start()
    zero = Pinned(server.url, 0, SHORT, every=0.25).start()
    yield one, zero
    one.stop.set()
    zero.stop.set()


# ---- the commands -----------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    r = subprocess.run([*OPSCTL, *args, "--json"], capture_output=True, text=True, timeout=300)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout), time.monotonic() - t0


def status(url: str, *flags: str) -> tuple[int, dict, float]:
    return cli("status", url, *flags)


def direct(url: str, *flags: str) -> tuple[int, dict, float]:
    code, doc, took = cli("console", "--once", "--no-discover", url, *flags)
    validate(doc)
    return code, doc["endpoints"][0], took


def via_prom(prom_url: str, *flags: str) -> tuple[int, dict, float]:
    code, doc, took = cli("console", "--once", "--prometheus", prom_url, "--job", "vllm", *flags)
    validate(doc)
    # none when Prometheus did not answer in time (a starved machine): exit 3, said why
    none = {"state": None, "reason": f"{doc['reason']} {doc['hint']}", "engines": []}
    (e,) = doc["endpoints"] or [none]
    return code, e, took


def firing(prom, engine: str | None = None) -> list[dict]:
    return [
        a
        for a in prom.alerts()
        if a["labels"].get("alertname") == ALERT
        and a["state"] == "firing"
        and engine in (None, a["labels"].get("engine"))
    ]


def named(e: dict, start: str) -> None:
    """The endpoint is stalled, its reason starts with ``start``, engine 1 alone stalled."""
    assert e["state"] == "stalled" and e["reason"].startswith(start), e["reason"]
    assert [x["state"] for x in e["engines"]][1] == "stalled", e["engines"]
    assert e["engines"][0]["state"] != "stalled", e["engines"]


def healthy_again(url: str, prom_url: str) -> None:
    """Every view passes the server again (busy or ready)."""
    wait_until(lambda: status(url)[0] == 0, 180, "status healthy", lambda: status(url)[1])
    wait_until(lambda: direct(url)[0] == 0, 180, "direct --once healthy")
    wait_until(lambda: via_prom(prom_url)[0] == 0, 180, "--prometheus --once healthy",
               lambda: via_prom(prom_url)[1]["reason"])  # fmt: skip


def settled(url: str, name: str):
    """A condition: engine 1's ``name`` read the same as at the call before (a stopped or
    blocked engine publishes nothing: once the API server handled what it had sent, two
    reads a second apart agree)."""
    last: list[float | None] = [None]

    def same() -> bool:
        now = gauge(url, name, "1")
        before, last[0] = last[0], now
        return before == now

    return same


def stop_with_requests_running(pid: int, url: str, timeout: float = 240.0) -> float:
    """SIGSTOP EngineCore_DP1 with requests running on it, as its gauge says.

    Watching /metrics for a moment to stop it is a race on a busy 2-core machine (the
    engine finishes between two scrapes; tests/engine_cores.py). So it is stopped at
    once, with the closed-loop clients' requests queued to it, and given slices of CPU
    (tests.engine_cores.Cores) until its published gauge, settled, reads requests running;
    a slice that ended on a batch boundary (0 running) is followed by a longer one."""
    cores = Cores([pid])
    cores.stop()
    stopped_at = time.time()
    seconds, deadline = 0.02, time.monotonic() + timeout
    try:
        while True:
            wait_until(settled(url, RUNNING), 120, "engine 1's gauge settled", every=1.0)
            if gauge(url, RUNNING, "1") > 0:
                return stopped_at
            assert time.monotonic() < deadline, f"nothing running on engine 1: {cores.slices}"
            cores.slice(seconds, [pid])
            stopped_at, seconds = time.time(), min(0.5, 2 * seconds)
    except BaseException:
        cores.resume()  # never leave the engine frozen for the next test
        raise


def hang_with(url: str, pid: int, hold, running: bool, timeout: float = 240.0) -> None:
    """Create FILE.dp1 (EngineCore_DP1's next step blocks) with requests running on it
    (``running``: it is stopped with them first, then resumed into the block; a step
    that ended their batch is undone and tried again) or while it is idle."""
    dp1 = dp1_of(hold)
    if not running:
        wait_until(lambda: gauge(url, RUNNING, "1") == 0, timeout, "engine 1 idle")
        dp1.touch()
        return
    deadline = time.monotonic() + timeout
    while True:
        stop_with_requests_running(pid, url, max(1.0, deadline - time.monotonic()))
        dp1.touch()
        os.kill(pid, signal.SIGCONT)  # it finishes the step it was in, then blocks
        wait_until(settled(url, GEN), 120, "engine 1's generation flat", every=1.0)
        if gauge(url, RUNNING, "1") > 0:
            return
        dp1.unlink()
        assert time.monotonic() < deadline, "no hang with requests running"


# ---- read as it is: every view names each rank, the checks judge it (items 2 and 6) ----------


def test_tree_and_ledger_name_every_dp_rank(server):
    rank_views.check_tree(server.server.pid, RANKS)
    rank_views.check_ledger(Path(server.run_dir), RANKS)


def test_bundle_and_console_name_every_dp_rank(server, tmp_path):
    rank_views.check_bundle(Path(server.run_dir), RANKS, tmp_path)
    rank_views.check_console(server.url, server.server.pid, RANKS)


def test_invariance_on_a_dp2_url_runs_in_one_engine(server):
    before = rank_views.tokens_per_engine(server.url)
    assert sorted(before) == ["0", "1"]
    rc, doc, _err = rank_views.invoke("diag", "invariance", server.url, "--max-tokens", "8")
    after = rank_views.tokens_per_engine(server.url)
    (run,) = doc["runs"]
    rank_views.judged_as_is(rc, run)
    assert any("every request went to engine 0" in w for w in run["warnings"]), run["warnings"]
    # BS=1 and BS=N, 8 prompts x 8 tokens each: all on engine 0, none on engine 1
    assert after["1"] == before["1"], (before, after)
    assert after["0"] - before["0"] >= 2 * 8 * 8, (before, after)
    assert run["batch"]["tokens"] == 8 * 8


def test_certify_url_on_dp2_reports_every_check(server):
    rc, doc, err = rank_views.invoke("certify", server.url)
    roles = sorted(rank_views.certified_as_is(rc, doc, err, "OPSCTL_HANG_STEP").values())
    # the patch ledger of every rank process: both EngineCores and their workers
    assert roles == ["api_server", "engine_core", "engine_core", "worker", "worker"], roles
    assert len(read_records(server.run_dir)) >= len(roles)


# ---- (a) SIGSTOP --------------------------------------------------------------------------------


def test_a_stopped_dp_engine_among_a_serving_one_is_stalled_in_every_view(server, prom, load):
    url, pid = server.url, core_pid(server)
    one, zero = load
    stopped_at = stop_with_requests_running(pid, url)
    try:
        code, doc, took = status(url)
        assert code == 1 and doc["state"] == "stalled", doc["reason"]
        assert doc["reason"].startswith(f"engine 1 (EngineCore_DP1, pid {pid}) stopped"), doc
        assert doc["engines"][1]["state"] == "stalled"

        code, e, took = direct(url)
        assert code == 1, e["reason"]
        named(e, f"engine 1 (EngineCore_DP1, pid {pid}) stopped")
        assert "engine 0 " in e["reason"] and zero.answers  # engine 0 served meanwhile

        # over Prometheus: the metrics alone (the summed counters move: busy, exit 0 before)
        code, e, took = via_prom(prom.url)
        assert code == 1, e["reason"]
        named(e, "engine 1 (EngineCore_DP1): ")
        assert "requests running" in e["reason"] and e["engines"][1]["requests_running"] > 0
        print(f"\nDP-STOP --prometheus --once: stalled {time.time() - stopped_at:.1f} s after "
              f"SIGSTOP (look {took:.1f} s)")  # fmt: skip
        got = wait_until(lambda: firing(prom, "1"), 120, f"{ALERT} for engine 1", prom.alerts)
        assert got[0]["labels"]["instance"] == url.removeprefix("http://")
        assert firing(prom, "0") == []
        print(f"DP-STOP alert firing for engine 1 {time.time() - stopped_at:.1f} s after SIGSTOP")
    finally:
        os.kill(pid, signal.SIGCONT)
    # the held requests answer; then every view passes the drained server (under a CPU hog a
    # DP=2 API server serving 16 clients answered /metrics slower than the 1 s scrape:
    # Prometheus marked the target down, which the console rightly reads as no server)
    one.halt()
    zero.halt()
    assert one.errors == zero.errors == [] and set(one.answers) == {200}
    healthy_again(url, prom.url)
    wait_until(lambda: not firing(prom), 120, "the alert resolved", prom.alerts)
    assert firing(prom, "0") == []
    one.halt()
    zero.halt()
    assert one.errors == zero.errors == [] and set(one.answers) == set(zero.answers) == {200}


# ---- (b) the hang knob: no process stopped, only the metrics tell ------------------------------------


def test_a_hung_dp_engine_is_read_from_its_own_metrics_in_every_view(server, prom, load, hold):
    url = server.url
    one, zero = load
    hang_with(url, core_pid(server), hold, running=True)
    hung_at = time.time()
    try:
        code, e, _took = direct(url, "--stall-window", "5s")
        assert code == 1, e["reason"]
        named(e, "engine 1 (EngineCore_DP1): ")
        assert "requests running" in e["reason"] and e["engines"][1]["requests_running"] > 0
        code, doc, _ = status(url)
        assert code == 1 and doc["reason"].startswith("engine 1 (EngineCore_DP1): "), doc["reason"]
        assert doc["stopped_processes"] == [] and "requests running" in doc["reason"]
        code, e, _ = via_prom(prom.url)
        assert code == 1, e["reason"]
        named(e, "engine 1 (EngineCore_DP1): ")
        got = wait_until(lambda: firing(prom, "1"), 120, f"{ALERT} for engine 1", prom.alerts)
        assert got and firing(prom, "0") == []
        print(f"\nDP-HANG alert firing for engine 1 {time.time() - hung_at:.1f} s after the hang")
    finally:
        dp1_of(hold).unlink(missing_ok=True)
    # released: the held requests answer (engine 1 steps again), then the drained server
    # reads healthy. Not the other way round: with the 16 clients still sending, engine
    # 1's catch-up, engine 0's steps beside it and the API server take both cores, and
    # one `console --once` spent a minute importing (measured)
    one.halt()
    zero.halt()
    assert one.errors == zero.errors == [] and set(one.answers) == {200}
    wait_until(lambda: direct(url)[0] == 0, 180, "released: healthy again")


# ---- (c) hung while idle: the canary sent to that engine alone -------------------------------------


def test_an_engine_hung_while_idle_is_named_by_its_own_canary(server, hold):
    url = server.url
    zero = Pinned(url, 0, SHORT, every=0.25).start()  # engine 0 serves, engine 1 idle
    try:
        hang_with(url, core_pid(server), hold, running=False)
        code, doc, _took = status(url, "--canary-timeout", "3s")
        assert code == 1 and doc["state"] == "stalled", doc["reason"]
        assert doc["reason"].startswith("engine 1 (EngineCore_DP1): canary: "), doc["reason"]
        assert doc["engines"][1]["canary"]["ok"] is False
        assert doc["engines"][0]["state"] != "stalled"
        code, e, _ = direct(url, "--canary-timeout", "3s")
        assert code == 1, e["reason"]
        named(e, "engine 1 (EngineCore_DP1): canary: ")
    finally:
        dp1_of(hold).unlink(missing_ok=True)
    wait_until(lambda: status(url)[0] == 0, 180, "healthy again", lambda: status(url)[1])
    zero.halt()
    assert zero.errors == [] and set(zero.answers) == {200}


# ---- (d) SIGKILL of one EngineCore: named, never busy or ready in between -----------------------------


def test_a_killed_dp_engine_is_named_dead_until_the_server_is_gone(server, prom, load, tmp_path):
    url, pid = server.url, core_pid(server)
    settings = Settings(interval_s=0.25)
    src = DirectScrapeSource(targets.from_urls([url]), discover=False, settings=settings)
    pro = PrometheusSource(prom.url, job="vllm", settings=settings, timeout=5.0)
    src.start()
    pro.start()
    seen: list[tuple[float, str, str, str | None]] = []
    try:
        wait_until(lambda: (v := src.collect().endpoints) and v[0].state == "busy"
                   and v[0].local and v[0].local.procs, 120, "busy, roles read")  # fmt: skip
        server.server.track()  # as serve's supervision has, every second since ready
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        for clients in load:  # no new requests: on a dead server each would fail at once,
            clients.stop.set()  # and 16 closed loops of failures take a core from the views

        def look() -> bool:
            server.server.track()  # what serve's supervision does while it serves
            now = time.time() - killed_at
            for name, s in (("direct", src), ("prometheus", pro)):
                for v in s.collect().endpoints[:1]:
                    seen.append((now, name, v.state, v.reason))
            return server.server.exited() is not None and now > 15

        wait_until(look, 120, "the server torn down", every=0.1)
    finally:
        src.close()
        pro.close()
    mine = [(t, st, r) for t, n, st, r in seen if n == "direct"]
    first_dead = next(t for t, st, _ in mine if st == "dead")
    print(f"\nDP-KILL direct: dead {first_dead:.2f} s after SIGKILL of EngineCore_DP1")
    for name in ("direct", "prometheus"):
        runs, last = [], None
        for t, n, st, _ in seen:
            if n == name and st != last:
                runs.append(f"{st}@{t:.1f}s")
                last = st
        print(f"DP-KILL {name}: " + " -> ".join(runs))
    assert first_dead < 5.0, mine[:20]
    after = [(t, st, r) for t, st, r in mine if t >= first_dead]
    assert all(st == "dead" for _, st, _ in after), after
    assert all(r.startswith(f"EngineCore_DP1 (pid {pid}) gone") for *_, r in after), after[-1]
    # the rank that died first (item 5), once the server is gone: as serve's stopped event
    # says it (the same call), then status, the console's dead reason and runs bundle
    from opsctl.engine import supervise

    server.server.track()
    death = supervise.first_death(server.server)
    assert death is not None
    rank_views.check_first_death(death.to_dict(), "EngineCore_DP1", pid,
                                 {"EngineCore_DP0", "Worker_DP0", "Worker_DP1", "DPCoordinator",
                                  "APIServer"}, server.server.exited())  # fmt: skip
    rank_views.check_views_of_the_dead_run(
        Path(server.run_dir),
        server.server.pid,
        "EngineCore_DP1",
        tmp_path,
        server.url,
        death.to_dict()["cause"],
    )
