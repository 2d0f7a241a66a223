"""The console against real vLLM engines (one module, two engines, shared by every case):
one started by opsctl (a run) and one bare vLLM API server started without opsctl. Both
are discovered with roles and pids; a real stall (SIGSTOP of the EngineCore with
requests in flight) reads 'stalled' within the stall window while /health says 200,
and 'ready'/'busy' again after SIGCONT."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from opsctl.console import discovery, targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.domain.console_state import Settings
from tests.bare_vllm import _engine_lock, bare_vllm, no_inner_lock
from tests.conftest import OPSCTL, running_engine
from tests.engine_cores import ClosedLoad, Cores, wait_fresh
from tests.waiting import wait_until

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engines():
    from opsctl.engine.model import resolve

    with (
        _engine_lock(),
        no_inner_lock(),
        running_engine(
            "tiny-llama", load_format="dummy", max_model_len=512, max_num_seqs=16
        ) as ours,
        bare_vllm(str(resolve("tiny-llama").path)) as bare,
    ):
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


N_CLIENTS = 48  # closed-loop clients, 16 running at a time (max_num_seqs 16)
# 480 tokens fit only the opsctl-started engine (max_model_len 512)
BODY = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 480, "ignore_eos": True}


def test_sigstop_of_the_engine_core_reads_stalled_while_health_is_200(engines):
    """The core is stopped before the burst and let run in slices until the console's
    own scrapes read requests running (see tests/engine_cores.py: a freeze timed from
    /metrics is a race on a loaded machine); from then on it stays stopped, which is a
    real stall with requests in flight."""
    ours, _ = engines  # the opsctl-started engine: max_model_len 512, 16 sequences
    core = next(p.pid for p in discovery.process_roles(ours.pid) if p.role == "EngineCore")
    settings = Settings(interval_s=0.5, stall_window_s=4.0)
    target = targets.from_urls([ours.url])
    src = DirectScrapeSource(target, discover=False, settings=settings, timeout=15.0)
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
        cores.resume()
        wait_until(lambda: view().state in ("ready", "busy"), 180, "ready after SIGCONT", view)
        load.stop(600)
        assert load.failed == [] and load.done[ours.url] > 0, load.done
        wait_until(lambda: view().state == "ready", 120, "idle again", view)
    finally:
        load.halt()
        if cores.stopped:
            cores.resume()
        src.close()


def test_bare_server_once_json_figures_match_its_metrics(engines):
    _, bare = engines
    out = subprocess.run(
        [*OPSCTL, "console", "--once", "--json", "--no-discover", "--interval", "0.5", bare.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    e = json.loads(out.stdout)["endpoints"][0]
    assert e["source"] == "argument" and e["state"] == "ready"
    text = httpx.get(f"{bare.url}/metrics", timeout=5).text
    from opsctl.domain.metrics import parse_samples

    s = parse_samples(text)
    assert e["requests_running"] == s.get("vllm:num_requests_running")
    assert e["kv_capacity_tokens"] == int(s.info["num_gpu_blocks"]) * int(s.info["block_size"])
    assert sys.executable  # the CLI ran in this interpreter's environment
