"""Direct scraping against stand-in servers: a hung endpoint never ages the others, an
idle body is parsed once, a Bearer key is sent; and `opsctl console --once --json`
(schema, exit codes, the empty-fleet hint, the TUI's refusal without a terminal)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors.scrape import scrape_once
from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.domain.console_state import Settings
from tests.standin_vllm import KEY, StandInFleet
from tests.waiting import wait_until


def source(urls, **kw) -> DirectScrapeSource:
    settings = Settings(interval_s=kw.pop("interval", 0.2), stall_window_s=kw.pop("stall", 10.0))
    return DirectScrapeSource(targets.from_urls(urls), discover=False, settings=settings, **kw)


def test_a_hung_endpoint_never_ages_the_others():
    with StandInFleet(["healthy", "hung", "busy"]) as fleet:
        src = source(fleet.urls, interval=0.2, timeout=3.0)
        src.start()
        try:
            healthy, hung, busy = fleet.urls
            # while the hung endpoint's first poll waits its 3 s, the others poll on
            wait_until(lambda: src.tracker(healthy).scrapes >= 5, 20, "5 healthy polls")
            assert src.tracker(hung).scrapes == 0 or src.tracker(hung).scrapes <= 1
            worst = 0.0
            t_end = time.monotonic() + 3.5  # spans the hung endpoint's timeout
            while time.monotonic() < t_end:
                snap = src.collect()
                for v in snap.endpoints:
                    if v.target.url in (healthy, busy) and v.last_ok_at:
                        worst = max(worst, v.age(time.time()))
                time.sleep(0.05)
            assert worst < 2 * 0.2 + 0.5  # two intervals and scheduling slack on 2 busy cores
            wait_until(lambda: src.tracker(hung).scrapes >= 1, 20, "the hung poll to time out")
            v = src.tracker(hung).view
            assert v.state == "unreachable" and "timed out" in v.reason
        finally:
            src.close()


def test_idle_body_parsed_once_busy_body_every_time():
    with StandInFleet(["healthy", "busy"]) as fleet:
        src = source(fleet.urls, interval=0.1)
        src.start()
        try:
            idle, busy = (src.endpoints[u] for u in fleet.urls)
            wait_until(lambda: idle.tracker.scrapes >= 3 and busy.tracker.scrapes >= 3)
            assert idle.tracker.prev[1] is idle.tracker.window[0][1]  # the same parsed object
            assert busy.tracker.prev[1] is not busy.tracker.window[0][1]
        finally:
            src.close()


def test_api_key_is_sent_as_bearer():
    with StandInFleet(["keyed"]) as fleet:
        assert scrape_once(fleet.urls[0]).auth.status == 401
        assert scrape_once(fleet.urls[0], api_key=KEY).auth is None
        src = source(fleet.urls, api_key=KEY)
        src.start()
        try:
            wait_until(lambda: src.tracker(fleet.urls[0]).scrapes >= 1)
            assert src.tracker(fleet.urls[0]).view.state == "ready"
        finally:
            src.close()


def test_target_api_key_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_NODE_KEY", KEY)
    with StandInFleet(["keyed", "keyed"]) as fleet:
        f = tmp_path / "t.toml"
        f.write_text(
            f'[[targets]]\nname = "with"\nurl = "{fleet.urls[0]}"\napi_key_env = "MY_NODE_KEY"\n'
            f'[[targets]]\nname = "without"\nurl = "{fleet.urls[1]}"\n'
        )
        doc, code = run_once(["--targets", str(f)])
    states = {e["name"]: e["state"] for e in doc["endpoints"]}
    assert states == {"with": "ready", "without": "unauthorized"} and code == 1


def run_once(args: list[str]) -> tuple[dict, int]:
    r = CliRunner().invoke(
        app, ["console", "--once", "--json", "--no-discover", "--interval", "0.3", *args]
    )
    return json.loads(r.stdout), r.exit_code


def test_once_json_schema_and_figures():
    with StandInFleet(["healthy", "busy"]) as fleet:
        doc, code = run_once(fleet.urls)
    assert doc["schema"] == "opsctl.console/1" and code == 0
    assert doc["counts"] == {"ready": 1, "busy": 1}
    busy = next(e for e in doc["endpoints"] if e["state"] == "busy")
    for key in ("name", "url", "source", "model", "vllm_version", "requests_running",
                "requests_waiting", "kv_cache_usage", "prefix_cache_hit_rate",
                "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p50_s", "ttft_p95_s",
                "preemptions_total", "restarts_seen", "pids", "reason"):  # fmt: skip
        assert key in busy
    assert busy["model"] == "tiny-llama" and busy["vllm_version"] == "0.32.0"
    assert busy["generation_tokens_per_s"] == pytest.approx(200, rel=0.25)
    assert busy["source"] == "argument" and busy["max_model_len"] == 256
    assert set(busy["latency_s"]) == {"ttft", "tpot", "itl", "e2e", "queue", "prefill", "decode"}
    assert busy["kv_capacity_tokens"] == 8192 * 128


@pytest.mark.parametrize(
    ("modes", "want"),
    [
        (["healthy", "dead"], 1),
        (["healthy", "unauthorized"], 1),
        (["healthy", "hung"], 1),
        (["hung", "notvllm"], 3),
    ],
)
def test_once_exit_codes(modes, want):
    with StandInFleet(modes) as fleet:
        doc, code = run_once(fleet.urls)
    assert code == want, doc
    assert all(e["reason"] for e in doc["endpoints"] if e["state"] != "ready")


def test_empty_fleet_is_a_hint_not_an_error():
    r = CliRunner().invoke(app, ["console", "--once", "--json", "--no-discover"])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["endpoints"] == [] and "opsctl serve" in doc["hint"]
    assert "hint:" in r.stderr


def test_tui_refuses_without_a_terminal_and_names_the_plain_flag():
    r = CliRunner().invoke(app, ["console", "--no-discover"])
    assert r.exit_code == 2
    assert "terminal" in r.stderr and "--once" in r.stderr
    assert r.stdout == ""


def test_a_discovered_endpoint_that_discovery_no_longer_finds_is_dropped(monkeypatch):
    """A run stopped in order (meta.json stopped_at) is no longer discovered: its row goes
    away instead of reading 'dead' for ever; an endpoint given as an argument stays."""
    from opsctl.console import direct
    from opsctl.domain.console import Target

    monkeypatch.setattr(direct, "DISCOVER_EVERY_S", 0.1)
    with StandInFleet(["healthy", "healthy"]) as fleet:
        run = Target("tiny-llama@run", fleet.urls[0], "opsctl-run", run_dir="/nowhere")
        found = [[run]]
        src = DirectScrapeSource(
            targets.from_urls([fleet.urls[1]]),
            discover=True,
            settings=Settings(interval_s=0.1, stall_window_s=10.0),
            discover_fn=lambda: found[0],
        )
        src.start()
        try:
            wait_until(lambda: len(src.collect().endpoints) == 2, 20, "both endpoints")
            found[0] = []  # the run stopped
            wait_until(lambda: len(src.collect().endpoints) == 1, 20, "the run's row to go")
            assert [v.target.url for v in src.collect().endpoints] == [fleet.urls[1]]
        finally:
            src.close()
