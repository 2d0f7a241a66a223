"""The Prometheus source's pure half: the PromQL it sends, the parsing of recorded real
Prometheus 2.42 answers (tests/data/prom_*.json, recorded by `python -m
tests.prometheus_fixture` from a real Prometheus scraping stand-ins in every mode, one of
them restarted) and their mapping to the console's views and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.console import judge_prom as prom
from opsctl.console import judge_prom_view as prom_view
from opsctl.console.judge import Quantiles, Scrape, Target
from opsctl.console.judge_prom import InstanceData, PromTarget
from opsctl.console.judge_state import EndpointTracker, Settings
from opsctl.console.report import document, endpoint_dict
from opsctl.domain.metrics import (
    GEN_TOKENS,
    KV_USAGE,
    LATENCY_HISTOGRAMS,
    RUNNING,
    STEPS,
    MetricSamples,
)
from opsctl.engine.server import free_port

DATA = Path(__file__).resolve().parents[1] / "data"
FLEET = json.loads((DATA / "prom_fleet.json").read_text())
STATE_OF_MODE = {
    "healthy": "ready",
    "busy": "busy",
    "stalled": "stalled",
    "dead": "dead",
    "hung": "unreachable",
    "unauthorized": "unauthorized",
    "notvllm": "unreachable",
    "restarted": "restarted",
}


def load(name: str):
    return json.loads((DATA / f"prom_{name}.json").read_text())


def recorded_views(job: str | None = "vllm") -> dict[str, prom_view.PromEndpoint]:
    settings = Settings(interval_s=1.0, stall_window_s=FLEET["stall_window_s"])
    found = prom.parse_targets(load("targets"))
    query = load("query" if job else "query_all")  # sum by (instance) | by (job, instance)
    data = prom.group_results(prom.data_of(query, "vector"), job)
    if job:  # the latency query was recorded with the job (figures fall back to none)
        latency = prom.group_results(prom.data_of(load("latency"), "vector"), job)
        data = {k: d.with_scalars(latency[k].scalars if k in latency else None)
                for k, d in data.items()}  # fmt: skip
    points = prom.stall_points(prom.data_of(load("stall"), "matrix"), job)
    chosen, health = prom_view.select(found, job, prom.jobs_with_vllm(data))
    out = {}
    for t in chosen:
        ep = prom_view.PromEndpoint(t, settings)
        key = (t.job, t.instance)
        ep.observe(prom_view.PromPoll(t, health.get(t.url), data.get(key), points.get(key, {}), 0))
        out[t.url] = ep
    return out


# ---- parsing --------------------------------------------------------------------------------


def test_targets_are_parsed_with_health_targets_apart():
    found = prom.parse_targets(load("targets"))
    assert len(found) == 2 * len(FLEET["modes"])
    metrics = [t for t in found if not t.is_health]
    assert {t.url for t in metrics} == set(FLEET["modes"])
    assert all(t.job == "vllm" and t.path == "/metrics" and t.interval_s == 1.0 for t in metrics)
    assert all(dict(t.labels) == {"job": "vllm"} for t in metrics)
    by_url = {t.url: t for t in found if t.is_health}
    mode_of = FLEET["modes"]
    dead = next(u for u, m in mode_of.items() if m == "dead")
    hung = next(u for u, m in mode_of.items() if m == "hung")
    assert by_url[dead].health == "down" and "HTTP status 503" in by_url[dead].last_error
    assert "context deadline exceeded" in by_url[hung].last_error
    assert all(t.last_scrape and t.last_scrape > 1.6e9 for t in found)


@pytest.mark.parametrize(
    ("text", "want"),
    [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), ("", None), ("5x", None)],
)
def test_durations(text, want):
    assert prom.parse_duration(text) == want


def test_times_and_numbers():
    assert prom.parse_time("2026-12-01T02:40:09.56294213Z") == pytest.approx(1796092809.562942)
    assert prom.parse_time("0001-01-01T00:00:00Z") is None  # never scraped
    assert prom.parse_time("2026-12-01T03:40:09+01:00") == pytest.approx(1796092809.0)
    assert prom.parse_time("yesterday") is None
    assert prom.number("NaN") is None and prom.number("+Inf") == float("inf")
    assert prom.number("4") == 4.0 and prom.number(None) is None


def test_error_answers_say_what_prometheus_said():
    with pytest.raises(prom.PromError, match="bad_data: invalid parameter"):
        prom.data_of(load("error"))
    with pytest.raises(prom.PromError, match="answered a vector, not a matrix"):
        prom.data_of(load("query"), "matrix")
    with pytest.raises(prom.PromError, match="no JSON object"):
        prom.data_of([1, 2])
    with pytest.raises(prom.PromError, match="no activeTargets"):
        prom.parse_targets({"status": "success", "data": {}})


@pytest.mark.parametrize(
    ("scrape_url", "base", "path"),
    [
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000", "/metrics"),
        ("http://Node-1:8000/health", "http://node-1:8000", "/health"),
        ("https://h:443/vllm/a/metrics?x=1", "https://h:443/vllm/a", "/vllm/a/metrics"),
        ("http://h:9/other", "http://h:9/other", "/other"),
    ],
)
def test_base_urls(scrape_url, base, path):
    assert prom.base_url(scrape_url) == (base, path)


# ---- the queries ----------------------------------------------------------------------------


def test_two_instant_queries_carry_every_figure_with_unique_tags():
    w = prom.Windows(rate_s=2.0, latency_s=60.0, restart_s=10.0, stall_s=12.0)
    parts = prom.figure_parts("vllm", w)
    parts += [p for short in LATENCY_HISTOGRAMS for p in prom.latency_parts("vllm", w, short)]
    tags = [k for k, _ in parts]
    assert len(tags) == len(set(tags))
    q = prom.figures_query("vllm", w)
    for fn in ("rate(", "increase(", "resets(", "changes(", "up{", "timestamp("):
        assert fn in q
    assert "[2000ms]" in q and "[10000ms]" in q and "histogram_quantile" not in q
    lat = prom.latency_queries("vllm", w)
    assert len(lat) == 7 and all(q.count("histogram_quantile(") == 4 * 2 for q in lat)
    assert all("[60000ms]" in q for q in lat)
    assert q.count(" or label_replace(") == len(prom.figure_parts("vllm", w)) - 1
    assert "sum by (instance)" in q and "job, instance" not in q
    assert "sum by (job, instance)" in prom.figures_query(None, w)
    assert prom.stall_query("vllm", w).endswith('job="vllm"}[12000ms]')


def test_job_names_are_quoted():
    assert prom.selector('a"b\\c') == '{job="a\\"b\\\\c"}'
    assert prom.selector(None) == ""


def test_windows_follow_the_scrape_interval():
    s = Settings(interval_s=1.0, stall_window_s=10.0)
    assert prom_view.windows(s, 5.0) == prom.Windows(10.0, 60.0, 10.0, 20.0)
    assert prom_view.windows(s, 1.0) == prom.Windows(2.0, 60.0, 10.0, 12.0)
    assert prom_view.windows(Settings(interval_s=30.0), 5.0).rate_s == 30.0


# ---- mapping to views -----------------------------------------------------------------------


def test_recorded_fleet_reads_the_state_of_every_mode():
    eps = recorded_views()
    got = {url: ep.view.state for url, ep in eps.items()}
    assert got == {url: STATE_OF_MODE[m] for url, m in FLEET["modes"].items()}
    mode = {m: eps[u].view for u, m in FLEET["modes"].items()}
    assert "generation tokens flat" in mode["stalled"].reason
    assert "engine steps and KV cache flat too" in mode["stalled"].reason
    assert mode["dead"].reason == "/health HTTP 503"
    assert "context deadline exceeded" in mode["hung"].reason
    assert "not a vLLM server" in mode["notvllm"].reason
    assert mode["unauthorized"].reason.startswith("HTTP 401")
    assert mode["restarted"].restarts == 1


def test_recorded_figures_match_the_stand_in_bodies():
    mode = {m: recorded_views()[u].view for u, m in FLEET["modes"].items()}
    busy, idle, stalled = mode["busy"].figures, mode["healthy"].figures, mode["stalled"].figures
    assert busy.running == 4 and stalled.running == 16 and idle.running == 0
    assert busy.generation_tps == pytest.approx(200, rel=0.05)
    assert busy.steps_per_s == pytest.approx(4, rel=0.05)
    assert idle.generation_tps == 0 and idle.generation_tokens_total == 737
    assert idle.kv_capacity_tokens == 8192 * 128 and idle.engines == 1
    assert idle.latency_basis == "lifetime"
    ttft = idle.latency["ttft"]
    assert ttft.p50 is not None and ttft.p50 <= ttft.p95 <= ttft.p99 and ttft.count > 0
    assert idle.finished_by_reason and idle.requests_total == sum(idle.finished_by_reason.values())
    assert mode["healthy"].info.models[0].id == "tiny-llama"
    # the data's own scrape time (timestamp()), not the target list's newer lastScrape
    data = prom.group_results(prom.data_of(load("query"), "vector"), "vllm")
    healthy = next(u for u, m in FLEET["modes"].items() if m == "healthy")
    assert mode["healthy"].last_ok_at == data[("vllm", healthy.split("//")[1])].get("sample_t")
    assert mode["dead"].figures.running == 0  # /metrics still answered


def test_json_document_has_the_direct_sources_fields():
    eps = recorded_views()
    from opsctl.console.judge import FleetSnapshot

    snap = FleetSnapshot(1.0, tuple(ep.view for ep in eps.values()), 1.0, "prometheus")
    doc = document(snap)
    assert doc["schema"] == "opsctl.console/4" and doc["source"] == "prometheus"
    assert doc["exit_code"] == 1 and doc["counts"]["unreachable"] == 2
    direct_keys = set(endpoint_dict(EndpointTracker(Target("x", "http://x:1", "argument")).view, 0))
    assert all(set(e) == direct_keys for e in doc["endpoints"])
    assert {e["source"] for e in doc["endpoints"]} == {"prometheus"}


def test_without_a_job_the_jobs_exporting_vllm_series_are_chosen():
    eps = recorded_views(job=None)
    assert set(eps) == set(FLEET["modes"])  # the health job is not an endpoint
    got = {url: ep.view.state for url, ep in eps.items()}
    assert got == {url: STATE_OF_MODE[m] for url, m in FLEET["modes"].items()}


def _t(url: str, job: str = "vllm", path: str = "/metrics", health: str = "up", err: str = ""):
    return PromTarget(job, url.split("//")[1], url, path, (("job", job),), health, err, 5.0,
                      0.01, 1.0)  # fmt: skip


def test_select_and_hints():
    a, b = _t("http://a:1"), _t("http://b:1", job="other")
    h = _t("http://a:1", job="vllm-health", path="/health")
    chosen, health = prom_view.select([a, b, h, a], "vllm", set())
    assert chosen == [a] and health == {"http://a:1": h}
    assert prom_view.select([a, b, h], None, {"other"})[0] == [b]
    assert prom_view.fleet_hint("P", "vllm", None, chosen, health, {"vllm"}) is None
    assert prom_view.fleet_hint("P", "vllm", None, [b], health, set()) == prom_view.NO_HEALTH_HINT
    assert "no active targets in job 'x' (jobs: other, vllm)" in prom_view.fleet_hint(
        "P", "x", None, [], {}, {"vllm", "other"}
    )
    assert "pass --job" in prom_view.fleet_hint("P", None, None, [], {}, set())
    assert prom_view.fleet_hint("P", None, "ConnectError: x", [], {}, set()).endswith("x")


def test_scrape_status_from_target_health():
    assert prom_view.scrape_status(_t("http://a:1"), "/metrics").status == 200
    down = _t("http://a:1", health="down", err="server returned HTTP status 403 Forbidden")
    assert prom_view.scrape_status(down, "/metrics").status == 403
    refused = _t("http://a:1", health="down", err='Get "x": connection refused')
    st = prom_view.scrape_status(refused, "/metrics")
    assert st.status is None and "connection refused" in st.error
    assert prom_view.scrape_status(refused, "/metrics", up=1.0).status == 200  # query wins
    unknown = _t("http://a:1", health="unknown")
    assert prom_view.scrape_status(unknown, "/metrics") is None


def _inst(**scalars) -> InstanceData:
    return InstanceData(dict(scalars), {}, ("m",), {})


def test_latency_window_where_it_saw_requests_else_lifetime():
    d = _inst(**{"wc.ttft": 4.0, "ws.ttft": 2.0, "lc.ttft": 10.0, "ls.ttft": 9.0,
                 "qw.ttft.p50": 0.4, "qw.ttft.p90": 0.8, "qw.ttft.p95": 0.9, "qw.ttft.p99": 1.0,
                 "ql.ttft.p50": 9.0, "lc.e2e": 10.0, "ls.e2e": 20.0, "ql.e2e.p50": 1.5,
                 "qw.e2e.p50": 7.0, "lc.itl": 0.0})  # fmt: skip
    lat, basis = prom_view.latency(d)
    assert basis == "window"
    assert lat["ttft"] == Quantiles(0.4, 0.8, 0.9, 1.0, 0.5, 4.0)
    assert lat["e2e"].mean == 2.0 and lat["e2e"].count == 10.0 and lat["e2e"].p50 == 1.5
    assert lat["itl"] == Quantiles() and "tpot" not in lat
    assert prom_view.latency(_inst(**{"lc.e2e": 3.0, "ls.e2e": 3.0}))[1] == "lifetime"
    assert prom_view.latency(_inst())[1] == "none"


def test_interval_ratios_fall_back_to_lifetime():
    d = InstanceData(
        {"prefix_q": 100.0, "prefix_h": 25.0, "d_prefix_q": 0.0, "steps": 10.0,
         "step_tokens": 50.0, "d_steps": 2.0, "d_step_tokens": 20.0},
        {"by_source": {"a": 3.0, "b": 1.0}, "d_by_source": {"a": 0.0, "b": 2.0}},
        ("m",), {"num_gpu_blocks": "10", "block_size": "16"},
    )  # fmt: skip
    f = prom_view.figures(d)
    assert f.prefix_hit_rate == 0.25 and f.tokens_per_step == 10.0
    assert f.prompt_tokens_by_source == {"a": 0.0, "b": 1.0}
    assert f.kv_capacity_tokens == 160 and f.kv_used_tokens is None


# ---- the stall rule is EndpointTracker's ----------------------------------------------------


def _samples(running: float, gen: float, steps: float, kv: float = 0.25) -> MetricSamples:
    values = {RUNNING: running, GEN_TOKENS: gen, STEPS: steps, KV_USAGE: kv}
    return MetricSamples(values, {}, {}, {}, 1, 4)


SEQUENCES = {
    "flat with requests": [(4, 10, 5)] * 8,
    "moving": [(4, 10 + i, 5 + i) for i in range(8)],
    "idle": [(0, 10, 5)] * 8,
    "steps move, tokens flat": [(4, 10, 5 + i) for i in range(8)],
    # a long prefill as vLLM 0.32 publishes it: no step, no token, the KV cache filling
    "kv fills, steps and tokens flat": [(4, 10, 5, 0.1 + 0.01 * i) for i in range(8)],
    "stalls late": [(4, 10 + min(i, 3), 5 + min(i, 3)) for i in range(10)],
    "recovers": [(4, 10, 5)] * 6 + [(4, 11, 6), (4, 12, 7)],
    "running drops": [(4, 10, 5)] * 4 + [(0, 10, 5)] + [(4, 10, 5)] * 3,
}


@pytest.mark.parametrize("name", list(SEQUENCES))
@pytest.mark.parametrize("window", [2.0, 4.5])
def test_progress_rule_equals_the_direct_trackers(name, window):
    from opsctl.console.judge import HttpStatus

    settings = Settings(interval_s=1.0, stall_window_s=window)
    tracker = EndpointTracker(Target("x", "http://x:1", "argument"), settings)
    progress = prom_view.Progress()
    ok = HttpStatus("/health", 200)
    seqs = [(*p, 0.25)[:4] for p in SEQUENCES[name]]  # (running, gen, steps, kv)
    for i, point in enumerate(seqs):
        t = 100.0 + i
        tracker.observe(Scrape("http://x:1", t, t, ok, ok, _samples(*point)))
        # overlapping ranges, as a poll sees them: the last three samples each time
        seq = seqs[max(0, i - 2) : i + 1]
        start = 100.0 + max(0, i - 2)
        progress.feed([(start + j, *p) for j, p in enumerate(seq)])
        assert progress.stall(window) == tracker._stall(), (name, i)
        assert (tracker.view.state == "stalled") == (progress.stall(window) is not None)


# ---- the command: bad combinations and an absent Prometheus --------------------------------


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--prometheus", "http://p:9090", "http://h:8000"], 2, "drop URL arguments"),
        (["--prometheus", "http://p:9090", "--targets", "t.toml"], 2, "drop --targets"),
        (["--job", "vllm"], 2, "--job selects a Prometheus scrape job"),
        (["--prometheus", "ftp://p"], 2, "not an http(s) URL"),
        (["--prometheus", "http://127.0.0.1:{port}"], 3, "cannot reach Prometheus"),
    ],
)
def test_console_prometheus_flags(args, code, needle):
    from typer.testing import CliRunner

    from opsctl.cli import app

    args = [a.replace("{port}", str(free_port())) for a in args]
    r = CliRunner().invoke(app, ["console", *args, "--once", "--json"])
    lines = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert len(lines) == 1 and needle in lines[0], r.stderr
    if code == 3:  # --json reports the state it found (opsctl.error/1, from opsctl.cli)
        import json

        doc = json.loads(r.stdout)
        assert doc["state"] == "unreachable" and doc["exit_code"] == 3 and needle in doc["error"]
    else:
        assert r.stdout == ""
