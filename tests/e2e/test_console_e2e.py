"""The console against real vLLM engines (one module, two engines, shared by every case):
one started by opsctl (a run) and one bare vLLM API server started without opsctl. Both
are discovered with roles and pids; a real stall (SIGSTOP of the EngineCore with
requests in flight) reads 'stalled' within the stall window while /health says 200,
and 'ready'/'busy' again after SIGCONT. The same stall is the health gate's case:
`opsctl console --once` (the real CLI, in its own process) never passes it (it keeps
looking for the stall window, then exit 1 'stalled'), passes the engine again once
resumed (busy or ready while the load runs, ready once drained), and answers an idle
server within about one interval."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from opsctl.console import discovery, targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from tests.conftest import OPSCTL, two_engines
from tests.engine_cores import ClosedLoad, Cores, wait_fresh
from tests.unit.test_console_collect import validate
from tests.waiting import wait_until

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engines():
    kw = dict(load_format="dummy", max_model_len=512, max_num_seqs=16)
    with two_engines(kw, bare=True) as (ours, bare):
        yield ours, bare


def test_both_servers_discovered_with_roles_and_pids(engines):
    ours, bare = engines
    out = subprocess.run(
        [*OPSCTL, "console", "--once", "--json", "--interval", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    by_url = {e["url"]: e for e in doc["endpoints"]}
    run = by_url[ours.url]
    found = next(e for e in doc["endpoints"] if e["pid"] == bare.pid)
    assert run["source"] == "opsctl-run" and run["pid"] == ours.pid and run["run_dir"]
    assert found["source"] == "discovered" and found["url"].endswith(f":{bare.port}")
    for e in (run, found):
        assert e["state"] in ("ready", "busy"), e
        assert e["model"] == "tiny-llama" and e["vllm_version"] == "0.32.0"
        roles = {p["role"] for p in e["pids"]}
        assert {"APIServer", "EngineCore"} <= roles, e["pids"]
        assert e["pids"][0] == {"pid": e["pid"], "role": "APIServer"}
        assert e["kv_capacity_tokens"] and e["requests_running"] is not None


def once(url: str, *flags: str) -> tuple[int, dict, float]:
    """`opsctl console --once --json` on one URL (the real CLI): exit code, its
    document (checked against the opsctl.console/4 schema), wall seconds."""
    t0 = time.monotonic()
    r = subprocess.run(
        [*OPSCTL, "console", "--once", "--json", "--no-discover", "--interval", "0.5", *flags,
         url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert r.stdout, r.stderr
    return r.returncode, validate(json.loads(r.stdout)), took


ONCE_WINDOW_S = 4.0  # --stall-window of the gate's look at the stalled engine
N_CLIENTS = 48  # closed-loop clients, 16 running at a time (max_num_seqs 16)
# the closed loop keeps the engine busy, whatever a request's length; short requests
# keep the drain after SIGCONT short (48 in flight, 16 at a time)
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 120, "ignore_eos": True}


def test_sigstop_of_the_engine_core_reads_stalled_while_health_is_200(engines):
    """The core is stopped before the burst and let run in slices until the console's
    own scrapes read requests running (see tests/engine_cores.py: a freeze timed from
    /metrics is a race on a loaded machine); from then on it stays stopped, which is a
    real stall with requests in flight."""
    ours, _ = engines  # the opsctl-started engine: max_model_len 512, 16 sequences
    core = next(p.pid for p in discovery.process_roles(ours.pid) if p.role == "EngineCore")
    settings = Settings(interval_s=0.5, stall_window_s=4.0)
    target = targets.from_urls([ours.url])
    # judged by its scrapes alone (as a remote server would be): the stall window's case
    src = DirectScrapeSource(
        target, discover=False, settings=settings, timeout=15.0, identify=False
    )
    src.start()
    cores = Cores([core])
    load = ClosedLoad([ours.url], N_CLIENTS, BODY)

    def view():
        return src.tracker(ours.url).view

    def settle() -> None:
        wait_fresh(lambda: src.tracker(ours.url).last_ok_at, 90, ours.url)

    try:
        wait_until(lambda: view().state == "ready", 180, "ready", view)
        cores.stop()
        load.start()
        cores.run_until(
            lambda: [] if view().figures.running else [core],
            lambda: (view().figures.running, view().figures.generation_tokens_total),
            settle,
            timeout=240,
            show=lambda: (view(), load.failed[:3], load.done),
        )
        t_stop = time.monotonic()  # the core has been stopped since the last slice
        wait_until(lambda: view().state == "stalled", 90, "stalled", lambda: (view(), load.done))
        took = time.monotonic() - t_stop
        health = httpx.get(f"{ours.url}/health", timeout=15).status_code
        assert health == 200 and view().health_status == 200
        # the stall window, a few poll intervals, and one slow scrape on a loaded machine
        assert took <= settings.stall_window_s + 4 * settings.interval_s + 15.0, took
        print(f"stalled reported {took:.1f} s after the freeze (window "
              f"{settings.stall_window_s} s; slices {cores.slices})")  # fmt: skip
        assert view().figures.running and view().figures.running > 0
        assert "generation tokens flat" in view().reason

        # the health gate on the same stall: never passed; it is local, so the stopped
        # EngineCore decides it at once (no need to watch the window)
        code, doc, took = once(ours.url, "--stall-window", f"{ONCE_WINDOW_S:g}s")
        e = doc["endpoints"][0]
        assert code == 1 and e["state"] == "stalled", (doc["reason"], e)
        assert e["health_status"] == 200 and e["requests_running"] > 0
        assert f"EngineCore (pid {core}) stopped" in e["reason"]
        assert doc["reason"].startswith("1 stalled")
        print(f"gate on the stall: --once observed {doc['observed_s']} s "
              f"(window {ONCE_WINDOW_S:g} s), process {took:.1f} s")  # fmt: skip
        frozen = e["generation_tokens_total"]

        cores.resume()
        wait_until(lambda: view().state in ("ready", "busy"), 180, "ready after SIGCONT", view)
        # the load goes on: the gate passes (a scrape may fall between a client's answer
        # and its next request: ready) and sees generation again
        code, doc, took = once(ours.url, "--stall-window", "60s")
        e = doc["endpoints"][0]
        assert code == 0 and e["state"] in ("busy", "ready"), (doc["reason"], e)
        assert e["generation_tokens_total"] > frozen
        print(f"gate after SIGCONT: {e['state']}, observed {doc['observed_s']} s")
        load.stop(600)
        assert load.failed == [] and load.done[ours.url] > 0, load.done
        wait_until(lambda: view().state == "ready", 120, "idle again", view)
        code, doc, _ = once(ours.url)
        assert code == 0 and doc["endpoints"][0]["state"] == "ready", doc["reason"]
    finally:
        load.halt()
        if cores.stopped:
            cores.resume()
        src.close()


def test_bare_server_once_json_figures_match_its_metrics(engines):
    """Also the gate's idle case: it answers within about one interval, not the window."""
    _, bare = engines
    code, doc, took = once(bare.url, "--stall-window", "30s")
    assert code == 0, doc["reason"]
    assert doc["schema"] == "opsctl.console/4" and doc["stall_window_s"] == 30.0
    # two scrapes half a second apart (a busy host's slow /metrics aside), never the window
    assert doc["observed_s"] < 10.0, doc["observed_s"]
    print(f"gate on an idle server: observed {doc['observed_s']} s, process {took:.1f} s")
    e = doc["endpoints"][0]
    assert e["source"] == "argument" and e["state"] == "ready"
    text = httpx.get(f"{bare.url}/metrics", timeout=5).text
    from opsctl.domain.metrics import parse_samples

    s = parse_samples(text)
    assert e["requests_running"] == s.get("vllm:num_requests_running")
    assert e["kv_capacity_tokens"] == int(s.info["num_gpu_blocks"]) * int(s.info["block_size"])
    assert sys.executable  # the CLI ran in this interpreter's environment


def test_an_engine_stopped_while_idle_is_never_ready(engines):
    """Issue 35's false healthy: the EngineCore stopped while idle leaves /health 200 and
    /metrics at 0 running, 0 waiting. `status` and `console --once` read the stopped
    process; where processes cannot be seen (a remote server), the canary's 1-token
    completion does not return and says stalled too. Resumed, all say ready again."""
    from opsctl.checks import status
    from opsctl.checks.target import UrlTarget

    ours, _ = engines
    core = next(p.pid for p in discovery.process_roles(ours.pid) if p.role == "EngineCore")
    wait_until(lambda: once(ours.url)[1]["endpoints"][0]["state"] == "ready", 180, "idle")
    cores = Cores([core])
    cores.stop()
    try:
        r = subprocess.run(
            [*OPSCTL, "status", ours.url, "--json"], capture_output=True, text=True, timeout=120
        )
        doc = json.loads(r.stdout)
        assert r.returncode == 1 and doc["state"] == "stalled", (doc, r.stderr)
        assert doc["health_status"] == 200 and not doc["healthy"]
        assert doc["stopped_processes"] == [{"pid": core, "role": "EngineCore"}]
        assert doc["metrics"]["requests_running"] == 0  # the gauges cannot show it
        assert doc["canary"] is None  # decided by the process, no request sent
        code, gate, _ = once(ours.url)
        e = gate["endpoints"][0]
        assert code == 1 and e["state"] == "stalled" and "stopped" in e["reason"], e
        # no process to look at: the canary decides
        remote = status.run(UrlTarget(ours.url), status.Options(local=False, canary_timeout=3.0))
        doc = remote.to_dict()
        assert doc["state"] == "stalled" and doc["canary"]["ok"] is False, doc
        assert doc["reason"].startswith("canary: a 1-token completion did not return within 3 s")
        assert doc["canary"]["seconds"] >= 3.0
        # where it is: the stopped EngineCore read by py-spy (it cannot run a handler)
        r = subprocess.run(
            [*OPSCTL, "stacks", ours.url, "--json"], capture_output=True, text=True, timeout=120
        )
        st = json.loads(r.stdout)
        (engine,) = [p for p in st["processes"] if p["pid"] == core]
        assert engine["state"] == "stopped" and "[stopped]" in engine["verdict"], engine
        assert engine["source"] in ("py-spy", "none"), engine
    finally:
        cores.resume()
    r = subprocess.run(
        [*OPSCTL, "status", ours.url, "--json"], capture_output=True, text=True, timeout=120
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["state"] == "ready", doc
    assert doc["canary"]["ok"] is True and doc["stopped_processes"] == []


def validate_stacks(doc: dict) -> None:
    from tests.cli.test_json_schemas import validate as by_schema

    by_schema(doc)


def test_stacks_of_a_real_engine_taken_without_stopping_it(engines):
    """opsctl stacks on the opsctl run (the stack_dump probe: SIGUSR2, faulthandler) and
    on the bare server (py-spy): every process labelled, the EngineCore waiting in vLLM's
    engine loop, both engines still serving afterwards."""
    ours, bare = engines
    for url, source in ((ours.url, "signal"), (bare.url, "py-spy")):
        r = subprocess.run(
            [*OPSCTL, "stacks", url, "--json"], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "opsctl.stacks/2" and doc["verdict"] == "pass", doc["headline"]
        validate_stacks(doc)
        roles = {p["role"]: p for p in doc["processes"]}
        assert {"APIServer", "EngineCore"} <= set(roles), roles.keys()
        core = roles["EngineCore"]
        assert core["source"] == source, core
        assert "vllm/v1/engine/core.py" in core["verdict"], core["verdict"]
        assert doc["groups"] and all(g["frames"] for g in doc["groups"])
        assert httpx.get(f"{url}/health", timeout=15).status_code == 200
    r = subprocess.run([*OPSCTL, "stacks", ours.url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "EngineCore (pid" in r.stdout and "thread(s)" in r.stdout


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_console_takes_a_stalled_engines_stacks_once_and_on_demand(engines):
    """Issue 35 item 2 in the TUI: the EngineCore stopped while idle reads stalled (its
    process is seen stopped); the console takes the tree's stacks once for that stall
    (not on every tick), its drill-in shows them with the one-line verdict naming the
    stopped EngineCore, and `t` takes them again on demand. Resumed, it is ready again."""
    from opsctl.console.stall_stacks import AT_STALL, ON_DEMAND
    from opsctl.console.view_app import DetailScreen, build_console_app
    from tests.ui.test_console_actions import select, wait_for

    ours, _ = engines
    url = ours.url
    core = next(p.pid for p in discovery.process_roles(ours.pid) if p.role == "EngineCore")
    settings = Settings(interval_s=0.5, stall_window_s=4.0)
    src = DirectScrapeSource(targets.from_urls([url]), discover=False, settings=settings)
    src.start()
    app = build_console_app(src, interval=0.5)
    cores = Cores([core])
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_for(pilot, lambda: url in app.table.cells, 120, "row")
            await wait_for(pilot, lambda: app.table.cells[url][1] == "ready", 180, "ready")
            assert app.stall_stacks.get(url) is None  # nothing taken while healthy
            cores.stop()
            await wait_for(pilot, lambda: app.table.cells[url][1] == "stalled", 60, "stalled")
            taken = lambda: app.stall_stacks.get(url)  # noqa: E731
            await wait_for(pilot, lambda: taken() and taken().done, 120, "stacks taken")
            first = taken()
            assert first.why == AT_STALL and first.error is None, first
            assert f"EngineCore (pid {core}) [stopped]" in first.headline, first
            ticks = app.ticks
            await wait_for(pilot, lambda: app.ticks >= ticks + 6, 60, "six more ticks")
            assert taken() is first  # once per stall, not per tick
            await select(pilot, app, url)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), 30, "drill-in")
            block = app.screen.query_one("#d-actions")
            await wait_for(
                pilot, lambda: "stacks taken at the stall" in str(block.render()), 30, "block"
            )
            assert "[stopped]" in str(block.render())
            await pilot.press("t")
            await wait_for(pilot, lambda: taken().why == ON_DEMAND and taken().done, 120, "t")
            assert f"EngineCore (pid {core}) [stopped]" in taken().headline
            cores.resume()
            await wait_for(pilot, lambda: app.last and app.last.endpoints[0].state == "ready",
                           180, "ready again")  # fmt: skip
    finally:
        if cores.stopped:
            cores.resume()
        src.close()
