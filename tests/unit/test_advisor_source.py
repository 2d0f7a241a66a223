"""The advisor on the console's sources and outputs (no engine): a run's ledger read
into facts, AdvisedSource over the direct source against stand-in servers (real HTTP,
recorded vLLM 0.32 /metrics), the --once JSON, the row's reason cell and the drill-in's
lines."""

from __future__ import annotations

import json
from dataclasses import replace

from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.console import judge as c
from opsctl.console import judge_advisor as a
from opsctl.console import render_advice as text
from opsctl.console.advice import AdvisedSource, advised, ledger_facts
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.source import SourceDefaults
from opsctl.console.targets import from_urls
from tests.standins.vllm_server import StandInFleet
from tests.waiting import wait_until


def test_ledger_facts_failed_patches_and_knobs(tmp_path):
    (tmp_path / "ledger").mkdir()
    record = {
        "pid": 123,
        "role": "EngineCore",
        "vllm_version": "0.32.0",
        "time": 1.0,
        "patches": [
            {"name": "batch_probe", "status": "failed", "reason": "target moved"},
            {"name": "kv_hybrid_recompute", "status": "applied"},
        ],
        "test_knobs": {"OPSCTL_TEST_NUDGE": "fox:3"},
    }
    (tmp_path / "ledger" / "123.json").write_text(json.dumps(record))
    facts = ledger_facts(str(tmp_path))
    assert facts.failed_patches == ("batch_probe (EngineCore pid 123): target moved",)
    assert facts.knobs == {"OPSCTL_TEST_NUDGE": "fox:3"}
    record["patches"] = [{"name": "kv_hybrid_recompute", "status": "applied"}]
    record.pop("test_knobs")
    (tmp_path / "ledger" / "123.json").write_text(json.dumps(record))
    assert ledger_facts(str(tmp_path)) == a.LocalFacts()


def test_advised_direct_source_reads_the_trackers_window():
    """The recorded body has 22 length finishes of 24 and prefix caching on: lifetime
    figures would say 'truncated', the window (counters flat) says nothing."""
    with StandInFleet(["healthy"]) as fleet:
        src = DirectScrapeSource(
            from_urls(fleet.urls), discover=False, settings=Settings(interval_s=0.2)
        )
        source = advised(src)
        assert isinstance(source, AdvisedSource)
        source.start()
        try:
            wait_until(lambda: source.tracker(fleet.urls[0]).scrapes >= 3, timeout=30)
            w = source.window(fleet.urls[0])
            (v,) = source.collect().endpoints
        finally:
            source.close()
    assert w is not None and w.scrapes >= 3 and w.window_s > 0
    assert w.finished == {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
    assert w.config["enable_prefix_caching"] == "True"
    assert v.figures.finished_by_reason["length"] == 22  # the lifetime total
    assert v.findings == ()


def test_once_json_has_findings_per_endpoint():
    with StandInFleet(["healthy", "stalled"]) as fleet:
        r = CliRunner().invoke(
            app,
            ["console", "--once", "--json", "--no-discover", "--interval", "0.3",
             "--stall-window", "1", *fleet.urls],
        )  # fmt: skip
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.console/4"
    by_state = {e["state"]: e["findings"] for e in doc["endpoints"]}
    assert by_state["ready"] == []
    (stalled,) = by_state["stalled"]
    assert stalled["code"] == "stalled" and stalled["severity"] == "fail"
    assert stalled["next"].startswith("opsctl console http://127.0.0.1:")
    assert stalled["figures"]["window_s"] is None


def _view(state: str = c.READY, reason: str | None = None) -> c.EndpointView:
    return c.EndpointView(
        c.Target("t", "http://127.0.0.1:9", "argument"), state, reason, c.Figures(),
        c.EngineInfo(), None, 200, 1.0, 1.0, 2, 0, 0.01,
    )  # fmt: skip


def test_reason_cell_and_drill_in_lines():
    w = a.Window(window_s=4.0, scrapes=5, preemptions=2.0, finished={"length": 10.0},
                 config={"enable_prefix_caching": "False"})  # fmt: skip
    v = _view()
    v = replace(v, findings=a.window_findings(v, w))
    assert text.reason_cell(v) == "⚑ kv_preemption +2"
    assert text.reason_cell(_view()) == ""
    stalled = replace(_view(c.STALLED, "16 requests running"), findings=v.findings)
    assert text.reason_cell(stalled) == "16 requests running  ⚑ kv_preemption +2"
    lines = text.detail_lines(stalled)
    assert lines[0] == "findings (4):"
    assert lines[1].startswith("  FAIL stalled: stalled: 16 requests running")
    assert (
        "    preemptions_per_s 0.5  preemptions 2  kv_cache_usage -  window_s 4  "
        "threshold_per_s 0.05"
    ) in lines
    assert "    next: opsctl console http://127.0.0.1:9" in lines
    assert text.detail_lines(_view()) == []


def test_console_row_filter_and_drill_in_show_the_findings():
    from opsctl.console.view_detail import summary_text
    from opsctl.console.view_panel import COLUMNS, matches, row_cells

    w = a.Window(window_s=4.0, scrapes=5, preemptions=2.0)
    v = replace(_view(), findings=a.window_findings(_view(), w))
    cells = dict(zip([k for k, _ in COLUMNS], row_cells(v, 1.0, 1.0), strict=True))
    assert cells["reason"] == "⚑ kv_preemption"
    assert matches(v, "kv_preemption") and not matches(_view(), "kv_preemption")
    text = summary_text(v, 1.0, 1.0).plain
    assert "findings (1):\n  WARNING kv_preemption: KV cache exhausted: 0.50 preemptions/s" in text
    assert "next: opsctl console http://127.0.0.1:9" in text
    assert "findings" not in summary_text(_view(), 1.0, 1.0).plain


class _Fixed(SourceDefaults):
    """A source without trackers (like Prometheus's) whose views change when told."""

    def __init__(self, views):
        self.views = views

    def collect(self):
        return c.FleetSnapshot(1.0, tuple(self.views), 1.0)


def test_findings_are_computed_once_per_scrape(monkeypatch):
    calls = []
    real = a.window_findings
    monkeypatch.setattr(
        a, "window_findings", lambda *args, **kw: calls.append(1) or real(*args, **kw)
    )
    v = replace(_view(), figures=c.Figures(preemption_rate=1.0, waiting=3.0))
    fixed = _Fixed([v])
    source = AdvisedSource(fixed)
    first = source.collect().endpoints[0].findings
    assert source.collect().endpoints[0].findings is first and len(calls) == 1
    assert [f.code for f in first] == ["kv_preemption", "queue_backlog"]
    assert first[0].figures["window_s"] is None  # no window of scrapes: the interval's rate
    fixed.views = [replace(v, scrapes=3, figures=c.Figures())]  # a new scrape: quiet
    assert source.collect().endpoints[0].findings == () and len(calls) == 2
    fixed.views = []
    assert source.collect().endpoints == () and source._memo == {}


def test_prefix_caching_off_on_the_plain_row_and_in_json(monkeypatch):
    """A server whose vllm:cache_config_info says enable_prefix_caching="False" (the
    recorded body, that label flipped): the finding on the --once table's row and in
    the JSON, with no window (configuration)."""
    import tests.standins.vllm_server as sv

    body = sv.METRICS.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert body != sv.METRICS
    monkeypatch.setattr(sv, "METRICS", body)
    with StandInFleet(["healthy"]) as fleet:
        args = ["console", "--once", "--no-discover", "--interval", "0.3", *fleet.urls]
        plain = CliRunner().invoke(app, args)
        doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert plain.exit_code == 0, plain.stderr
    (row,) = [line for line in plain.stdout.splitlines() if fleet.urls[0] in line]
    assert row.rstrip().endswith("⚑ prefix_caching_off")
    (f,) = doc["endpoints"][0]["findings"]
    assert f["code"] == "prefix_caching_off" and f["severity"] == "info"
    assert f["figures"]["window_s"] is None and f["next"] == f"opsctl console {fleet.urls[0]}"
