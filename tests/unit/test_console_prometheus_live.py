"""The console through a real Prometheus (Debian's package, started by the fixture of
tests/prometheus_fixture.py, scrape interval 1 s) scraping stand-in vLLM endpoints:
it reads the same states as the direct source over the same endpoints (healthy, busy,
stalled, dead, hung, 401, not vLLM), follows a restart and a recovery, and the CLI's
`--prometheus URL --job NAME --once --json` prints the same document kind."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.prometheus import PrometheusSource
from opsctl.errors import BadInput
from tests.conftest import OPSCTL
from tests.prometheus_fixture import prometheus  # noqa: F401 (the fixture)
from tests.standins.vllm_server import StandInFleet
from tests.waiting import wait_until

MODES = ["healthy", "busy", "stalled", "dead", "hung", "unauthorized", "notvllm"]
WANT = ["ready", "busy", "stalled", "dead", "unreachable", "unauthorized", "unreachable"]
SETTINGS = Settings(interval_s=0.5, stall_window_s=3.0, restart_hold_s=4.0)


def states(src) -> dict[str, str]:
    return {v.target.url: v.state for v in src.collect().endpoints}


@pytest.fixture
def both(prometheus):  # noqa: F811
    with StandInFleet(MODES) as fleet:
        server = prometheus(fleet.urls, interval=1.0)
        via_prom = PrometheusSource(server.url, job="vllm", settings=SETTINGS, timeout=3.0)
        direct = DirectScrapeSource(
            targets.from_urls(fleet.urls), discover=False, settings=SETTINGS, timeout=1.0
        )
        via_prom.start()
        direct.start()
        try:
            yield fleet, server, via_prom, direct
        finally:
            via_prom.close()
            direct.close()


def test_prometheus_and_direct_read_the_same_states(both):
    fleet, _, via_prom, direct = both
    want = dict(zip(fleet.urls, WANT, strict=True))
    for src in (via_prom, direct):
        wait_until(
            lambda s=src: states(s) == want, 30, f"{src.name} states", lambda s=src: states(s)
        )
    assert states(via_prom) == states(direct)
    snap = via_prom.collect()
    assert (
        snap.source == "prometheus" and snap.hint is None and snap.interval_s == 2.0
    )  # scrape + poll
    p = {v.target.url: v for v in snap.endpoints}
    d = {v.target.url: v for v in direct.collect().endpoints}
    for url, mode in zip(fleet.urls, MODES, strict=True):
        a, b = p[url].figures, d[url].figures
        assert (a.running, a.waiting, a.kv_usage) == (b.running, b.waiting, b.kv_usage), mode
        assert a.kv_capacity_tokens == b.kv_capacity_tokens
        assert p[url].target.name == url.split("//")[1] and p[url].target.source == "prometheus"
    busy = fleet.urls[1]

    # Prometheus stamps a sample with the scrape's start, the stand-in counts at its
    # answer: over 2 scrapes (the 2 s rate window) one answer lagging 0.5 s on busy cores
    # reads half the rate (98.9 tokens/s in CI). Wait for a reading of two even scrapes.
    def gen_tps() -> float | None:
        view = next((v for v in via_prom.collect().endpoints if v.target.url == busy), None)
        return None if view is None else view.figures.generation_tps

    wait_until(lambda: gen_tps() == pytest.approx(200, rel=0.1), 30, "200 tokens/s", gen_tps)
    assert "generation tokens flat" in p[fleet.urls[2]].reason


def test_restart_and_recovery_are_followed(both):
    fleet, _, via_prom, direct = both
    busy, stalled = fleet.urls[1], fleet.urls[2]
    wait_until(lambda: states(via_prom).get(stalled) == "stalled", 30, "stalled")
    fleet.set_mode(2, "busy")  # generation moves again
    fleet.reset_counters(1)  # a restart: the counters start again near zero
    for src in (via_prom, direct):
        wait_until(lambda s=src: states(s)[busy] == "restarted", 20, f"{src.name} restarted")
        wait_until(lambda s=src: states(s)[stalled] == "busy", 20, f"{src.name} recovered")
    view = next(v for v in via_prom.collect().endpoints if v.target.url == busy)
    assert view.restarts == 1 and "restarted" in view.reason
    wait_until(lambda: states(via_prom)[busy] == "busy", 20, "restart hold over")


def test_a_target_prometheus_drops_leaves_the_fleet_and_history_is_kept(both):
    fleet, _, via_prom, _ = both

    # the busy stand-in generates 200 tokens/s; after the previous test's restart of its
    # counters the rate ramps up again from 0, so wait for the history to show it
    def history() -> list[float]:
        return via_prom.series(fleet.urls[1], "generation_tps")

    wait_until(lambda: len(history()) >= 3 and max(history()) > 100, 30, "history")
    assert via_prom.series("http://nowhere:1", "running") == []
    via_prom.set_paused(True)
    polls = via_prom.polls
    time.sleep(1.5)
    assert via_prom.polls <= polls + 1 and via_prom.collect().paused
    via_prom.set_paused(False)
    wait_until(lambda: via_prom.polls > polls + 1, 10, "polling again")


def test_cli_once_json_through_prometheus(prometheus):  # noqa: F811
    with StandInFleet(["healthy", "busy"]) as fleet:
        server = prometheus(fleet.urls, interval=1.0, up=True)
        cmd = [*OPSCTL, "console", "--prometheus", server.url, "--job", "vllm", "--once", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["schema"] == "opsctl.console/4" and doc["source"] == "prometheus"
        got = {e["url"]: (e["state"], e["requests_running"]) for e in doc["endpoints"]}
        assert got == {fleet.urls[0]: ("ready", 0), fleet.urls[1]: ("busy", 4)}
        missing = [*OPSCTL, "console", "--prometheus", server.url, "--job", "nope", "--once"]
        out = subprocess.run(missing, capture_output=True, text=True, timeout=60)
        # a gate that found nothing to check does not pass: exit 3, one error line + hint
        assert out.returncode == 3 and out.stdout == "", out.stderr
        assert out.stderr.startswith("opsctl: error: no vLLM server found among the Prometheus")
        assert "no active targets in job 'nope'" in out.stderr
        assert "jobs: vllm, vllm-health" in out.stderr


def test_a_url_that_is_not_prometheus_is_refused():
    with StandInFleet(["healthy"]) as fleet:
        with pytest.raises(BadInput, match="is not a Prometheus API"):
            PrometheusSource(fleet.urls[0]).check()
        out = subprocess.run(
            [*OPSCTL, "console", "--prometheus", fleet.urls[0], "--once"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2 and "not a Prometheus API" in out.stderr


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_console_app_reads_the_prometheus_source(both):
    from opsctl.console.view_app import DetailScreen, build_console_app

    fleet, _, via_prom, _ = both
    app = build_console_app(via_prom, interval=0.5)
    want = dict(zip(fleet.urls, WANT, strict=True))
    async with app.run_test(size=(200, 40)) as pilot:
        deadline = time.monotonic() + 30
        while not (app.last and {v.target.url: v.state for v in app.last.endpoints} == want):
            assert time.monotonic() < deadline, "console app states"
            await pilot.pause(0.05)
        header = str(app.header.render())
        assert "7 endpoints" in header and "stalled 1" in header
        cells = [[str(x) for x in app.table.get_row_at(i)] for i in range(app.table.row_count)]
        busy = next(i for i, r in enumerate(cells) if r[1] == "busy")
        assert cells[busy][4] == "4"
        app.table.move_cursor(row=busy)
        await pilot.press("enter")
        while not isinstance(app.screen, DetailScreen):
            assert time.monotonic() < deadline, "drill-in"
            await pilot.pause(0.05)
        while "BUSY" not in str(app.screen.query_one("#d-summary").render()):
            assert time.monotonic() < deadline, "drill-in summary"
            await pilot.pause(0.05)
        await pilot.press("escape", "q")
