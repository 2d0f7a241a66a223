"""`opsctl console --once` as a health gate against a real bare vLLM server (one engine
for the module): it answers an idle server within about one interval, never passes a
stalled one (EngineCore SIGSTOPped with requests in flight, /health still 200: it keeps
looking for the stall window and exits 1 'stalled'), and passes it again once resumed
(busy or ready while the load runs, ready once drained). The real CLI runs in its own process."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from opsctl.console import discovery, targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.domain.console_state import Settings
from tests.bare_vllm import bare_vllm
from tests.conftest import OPSCTL
from tests.engine_cores import ClosedLoad, Cores, wait_fresh
from tests.unit.test_console_collect import validate
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

# the bare server runs 8 sequences of at most 256 tokens: 24 closed-loop clients keep
# requests waiting behind the running ones, so a slice that overruns still leaves some
N_CLIENTS = 24
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 200, "ignore_eos": True}
WINDOW_S = 4.0  # --stall-window of the stalled look


@pytest.fixture(scope="module")
def server():
    from opsctl.engine.model import resolve

    with bare_vllm(str(resolve("tiny-llama").path)) as bare:
        yield bare


def once(url: str, *flags: str) -> tuple[int, dict, float]:
    """The real CLI: exit code, its JSON document, wall seconds."""
    t0 = time.monotonic()
    r = subprocess.run(
        [*OPSCTL, "console", "--once", "--json", "--no-discover", "--interval", "0.5", *flags,
         url],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert r.stdout, r.stderr
    return r.returncode, validate(json.loads(r.stdout)), took


def test_idle_server_answers_within_about_one_interval(server):
    code, doc, took = once(server.url, "--stall-window", "30s")
    e = doc["endpoints"][0]
    assert code == 0 and e["state"] == "ready", (doc["reason"], e["reason"])
    assert doc["schema"] == "opsctl.console/2" and doc["stall_window_s"] == 30.0
    # two scrapes half a second apart (a busy host's slow /metrics aside), never the window
    assert doc["observed_s"] < 10.0, doc["observed_s"]
    print(f"idle: --once observed {doc['observed_s']} s, process {took:.1f} s")


def test_stalled_engine_fails_the_gate_and_passes_again_once_resumed(server):
    """The core is stopped before the load and sliced until the scrapes read requests
    running (tests/engine_cores.py: a freeze timed from /metrics races on a loaded
    machine), then stays stopped: a real stall with requests in flight."""
    core = next(p.pid for p in discovery.process_roles(server.pid) if p.role == "EngineCore")
    src = DirectScrapeSource(
        targets.from_urls([server.url]),
        discover=False,
        settings=Settings(interval_s=0.5, stall_window_s=600.0),
        timeout=15.0,
    )
    src.start()
    cores = Cores([core])
    load = ClosedLoad([server.url], N_CLIENTS, BODY)

    def view():
        return src.tracker(server.url).view

    def settle() -> None:
        wait_fresh(lambda: src.tracker(server.url).last_ok_at, 90, server.url)

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
        # what the core made before its last stop has reached /metrics: generation flat
        # between two scrapes with requests running (the stall the gate must not pass)
        wait_until(
            lambda: view().figures.running and view().figures.generation_tps == 0,
            90, "generation flat with requests running", view,
        )  # fmt: skip

        code, doc, took = once(server.url, "--stall-window", f"{WINDOW_S:g}s")
        e = doc["endpoints"][0]
        assert code == 1 and e["state"] == "stalled", (doc["reason"], e)
        assert e["health_status"] == 200 and e["requests_running"] > 0
        assert "generation" in e["reason"] and doc["reason"].startswith("1 stalled")
        assert doc["observed_s"] >= WINDOW_S  # it watched the window, not one interval
        assert httpx.get(f"{server.url}/health", timeout=15).status_code == 200
        print(f"stalled: --once observed {doc['observed_s']} s (window {WINDOW_S:g} s), "
              f"process {took:.1f} s; slices {cores.slices}")  # fmt: skip

        frozen = e["generation_tokens_total"]
        cores.resume()
        # the load goes on; tiny-llama on dummy weights finishes a request in a blink,
        # so a scrape may fall between a client's answer and its next request (ready)
        code, doc, took = once(server.url, "--stall-window", "60s")
        e = doc["endpoints"][0]
        assert code == 0 and e["state"] in ("busy", "ready"), (doc["reason"], e)
        assert e["generation_tokens_total"] > frozen  # it generates again
        print(f"resumed: {e['state']}, --once observed {doc['observed_s']} s, "
              f"process {took:.1f} s")  # fmt: skip

        load.stop(600)
        assert load.failed == [] and load.done[server.url] > 0, load.done
        wait_until(lambda: view().state == "ready", 120, "drained", view)
        code, doc, _ = once(server.url)
        assert code == 0 and doc["endpoints"][0]["state"] == "ready", doc["reason"]
    finally:
        load.halt()
        if cores.stopped:
            cores.resume()
        src.close()
