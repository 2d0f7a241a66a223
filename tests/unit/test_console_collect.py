"""Direct scraping against stand-in servers: a hung endpoint never ages the others, an
idle body is parsed once, a Bearer key is sent; and `opsctl console --once --json`
(schema, exit codes, the empty-fleet hint, the TUI's refusal without a terminal)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors.scrape import scrape_once
from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from tests.conftest import OPSCTL
from tests.standins.vllm_server import KEY, StandInFleet
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


SCHEMA_FILE = Path(__file__).resolve().parents[1] / "data/schemas/opsctl.console-4.schema.json"


def validate(doc: dict) -> dict:
    """``doc`` against the shipped opsctl.console/4 schema (every --once document here)."""
    import jsonschema

    jsonschema.Draft7Validator(json.loads(SCHEMA_FILE.read_text())).validate(doc)
    return doc


def run_once(args: list[str]) -> tuple[dict, int]:
    r = CliRunner().invoke(
        app, ["console", "--once", "--json", "--no-discover", "--interval", "0.3", *args]
    )
    return validate(json.loads(r.stdout)), r.exit_code


def test_once_json_schema_and_figures():
    with StandInFleet(["healthy", "busy"]) as fleet:
        # rates over 1 s, not 0.3 s: on busy cores a scrape's answer can lag its counter by
        # tenths of a second (264 tokens/s read over 0.3 s in a fresh clone beside engines)
        doc, code = run_once([*fleet.urls, "--interval", "1"])
    assert doc["schema"] == "opsctl.console/4" and code == 0
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


def test_empty_fleet_is_exit_3_with_one_line_and_the_hint():
    """A health gate that checked nothing does not pass."""
    r = CliRunner().invoke(app, ["console", "--once", "--json", "--no-discover"])
    assert r.exit_code == 3
    doc = validate(json.loads(r.stdout))
    assert doc["endpoints"] == [] and doc["exit_code"] == 3
    assert doc["reason"].startswith("no vLLM server found") and "opsctl serve" in doc["hint"]
    lines = r.stderr.splitlines()
    assert lines[0].startswith("opsctl: error: no vLLM server found") and len(lines) == 2
    assert lines[1].startswith("hint: start one with `opsctl serve`")
    r = CliRunner().invoke(app, ["console", "--once", "--no-discover"])
    assert r.exit_code == 3 and r.stdout == ""  # no table of nothing


def test_once_watches_a_stall_for_the_window_and_exits_1():
    """Requests running and generation flat: one interval cannot tell busy from stalled,
    so --once keeps looking until the stall window has passed."""
    with StandInFleet(["stalled", "healthy"]) as fleet:
        doc, code = run_once([*fleet.urls, "--stall-window", "2s"])
    stalled = doc["endpoints"][0]
    assert code == 1 and stalled["state"] == "stalled", stalled
    assert "generation tokens flat" in stalled["reason"]
    assert doc["stall_window_s"] == 2.0 and doc["observed_s"] >= 2.0
    assert doc["reason"].startswith("1 stalled of 2 endpoints")


def test_once_answers_an_idle_or_progressing_fleet_within_about_one_interval():
    with StandInFleet(["busy", "healthy"]) as fleet:
        t0 = time.monotonic()
        doc, code = run_once([*fleet.urls, "--stall-window", "30s"])
        took = time.monotonic() - t0
    assert code == 0 and doc["counts"] == {"busy": 1, "ready": 1}
    assert doc["observed_s"] < 5.0 and took < 10.0, (doc["observed_s"], took)  # not the window


def test_not_vllm_is_unreachable_not_a_vllm_server_exit_3():
    with StandInFleet(["notvllm"]) as fleet:
        r = CliRunner().invoke(app, ["console", "--once", "--json", "--no-discover",
                                     "--interval", "0.3", *fleet.urls])  # fmt: skip
    doc = validate(json.loads(r.stdout))
    e = doc["endpoints"][0]
    assert r.exit_code == 3 and e["state"] == "unreachable"
    assert e["reason"].startswith("not a vLLM server")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("opsctl: error: ")]
    assert len(errors) == 1 and "no vLLM server answered" in errors[0]
    assert "not a vLLM server" in errors[0] and errors[0].endswith(doc["reason"])


@pytest.mark.parametrize("url", ["http://256.1.1.1:9", "ftp://127.0.0.1:9", "http://[::1", "x:0"])
def test_an_invalid_url_is_bad_input_at_parse_time(url):
    r = subprocess.run([*OPSCTL, "console", "--once", "--json", "--no-discover", url],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stdout == "", r.stderr
    first, *rest = r.stderr.splitlines()
    assert first.startswith("opsctl: error: ") and url in first
    assert len(rest) <= 1 and all(line.startswith("hint: ") for line in rest), r.stderr
    assert "Traceback" not in r.stderr and "Task exception" not in r.stderr


@pytest.mark.parametrize(
    "flag", ["--stall-window=0", "--stall-window=-5", "--interval=0", "--interval=-1s"]
)
def test_zero_or_negative_durations_are_exit_2(flag):
    r = CliRunner().invoke(app, ["console", "--once", "--no-discover", flag])
    assert r.exit_code == 2 and flag.split("=")[0] in r.stderr


def test_durations_take_units():
    with StandInFleet(["healthy"]) as fleet:
        r = CliRunner().invoke(app, ["console", "--once", "--json", "--no-discover",
                                     "--interval", "1s",
                                     "--stall-window", "1m", *fleet.urls])  # fmt: skip
    doc = validate(json.loads(r.stdout))
    assert r.exit_code == 0 and doc["interval_s"] == 1.0 and doc["stall_window_s"] == 60.0


def test_piped_table_is_plain_full_columns():
    long_name = "a-very-long-endpoint-name-that-an-80-column-box-would-cut-" + "x" * 40
    with StandInFleet(["healthy"]) as fleet:
        f = Path(tempfile.mkdtemp()) / "t.toml"
        f.write_text(f'[[targets]]\nname = "{long_name}"\nurl = "{fleet.urls[0]}"\n')
        r = subprocess.run([*OPSCTL, "console", "--once", "--no-discover", "--interval", "0.3",
                            "--targets", str(f)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["name", "url", "source", "state", "model", "run", "wait",
                                "KV", "%", "gen", "tok/s", "TTFT", "p50", "reason"]  # fmt: skip
    assert len(lines) == 2 and long_name in lines[1] and fleet.urls[0] in lines[1]
    assert not set("─│┃━┏┓┗┛╇") & set(r.stdout)  # no box characters


def test_tui_refuses_without_a_terminal_and_names_the_plain_flag():
    r = CliRunner().invoke(app, ["console", "--no-discover"])
    assert r.exit_code == 2
    assert "terminal" in r.stderr and "--once" in r.stderr
    assert r.stdout == ""


def test_a_discovered_endpoint_that_discovery_no_longer_finds_is_dropped(monkeypatch):
    """A run stopped in order (meta.json stopped_at) is no longer discovered: its row goes
    away instead of reading 'dead' for ever; an endpoint given as an argument stays."""
    from opsctl.console import direct
    from opsctl.console.judge import Target

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
