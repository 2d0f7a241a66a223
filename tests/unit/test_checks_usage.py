"""opsctl.suite.usage.run called as a library (no CLI): against the stand-in scoring server
(tests/standins/scoring.py), the report it returns and the typed progress events it
sends, in order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.domain import platform as plat
from opsctl.errors import BadInput, EngineUnreachable, OpsTimeout
from opsctl.suite.usage import run as usage
from tests.standins.scoring import stand_in


def check(url: str, **options) -> tuple[usage.UsageReport, list[ev.Event]]:
    seen: list[ev.Event] = []
    report = usage.run(UrlTarget(url), usage.Options(**options), seen.append)
    return report, seen


def test_events_tell_the_check_as_it_runs() -> None:
    with stand_in(inflate=0) as url:
        report, seen = check(url)
    assert isinstance(report, usage.UsageReport) and report.verdict == "pass" and report.passed
    started, first_table = seen[0], seen[1]
    assert isinstance(started, ev.Started) and started.title == "diag usage"
    assert started.detail == f"checking {url}"
    assert isinstance(first_table, ev.Table) and first_table.rows == ()
    phases = [e for e in seen if isinstance(e, ev.Phase)]
    assert [(p.done, p.total) for p in phases] == [(n, 8) for n in range(1, 9)]
    results = [e for e in seen if isinstance(e, ev.CaseResult)]
    assert [r.name for r in results][:2] == ["/score one document", "/score several documents"]
    assert {r.verdict for r in results} == {"pass"}
    one = results[0]
    assert isinstance(one, usage.RowResult) and one.reported == one.expected == 15
    assert one.snapshot() == {"events": ["/score one document: reported 15, expected 15 -> pass"]}
    (model_line,) = [e for e in seen if isinstance(e, ev.Log)]
    assert model_line.text.startswith("model fake-reranker: cross-encoder (/classify answers)")
    tables = [e for e in seen if isinstance(e, ev.Table)]
    assert [len(t.rows) for t in tables] == list(range(9))  # one more row per request
    done = seen[-1]
    assert isinstance(done, ev.Finished) and done.verdict == "pass"
    assert done.summary == "8/8 match" and done.rows is not None and len(done.rows) == 8
    assert not [e for e in seen if isinstance(e, ev.Alert)]


def test_report_is_the_json_document() -> None:
    with stand_in(inflate=2) as url:
        report, seen = check(url)
    doc = report.to_dict()
    assert report.schema == doc["schema"] == "opsctl.diag.usage/2"
    assert list(doc) == [
        "schema",
        "url",
        "platform",
        "platform_note",
        "vllm_version",
        "model",
        "kind",
        "kind_source",
        "engine_started",
        "run_dir",
        "pair_separator",
        "pair_template",
        "expected_method",
        "expected_source",
        "local_cross_check",
        "rows",
        "findings",
        "verdict",
        "test_knobs",
        "warnings",
    ]
    assert report.verdict == doc["verdict"] == "fail" and not report.passed
    assert report.count("fail") == 8 and report.count("pass") == 0
    assert doc["engine_started"] is False and doc["run_dir"] is None
    assert doc["platform"] is None and doc["platform_note"] == plat.NOT_STARTED_NOTE
    assert doc["test_knobs"] == {} and doc["warnings"] == [] and report.knob_warning is None
    row = json.loads(json.dumps(doc))["rows"][0]
    assert row["input_tokens"] == list(doc["rows"][0]["input_tokens"])
    assert row["reported_prompt_tokens"] == row["reported_total_tokens"] is not None
    assert {"reported_prompt", "expected", "parts", "cross_check"}.isdisjoint(row)
    assert {e.verdict for e in seen if isinstance(e, ev.CaseResult)} == {"fail"}
    with pytest.raises(TypeError):
        report.document["verdict"] = "pass"  # type: ignore[index]


def test_unknown_template_is_unverified() -> None:
    with stand_in(style="odd") as url:
        report, seen = check(url)
    assert report.verdict == "unverified" and report.count("unverified") == 8
    failure = usage.outcome(report, usage.Options()).failure  # never a pass
    assert failure is not None and failure.exit_code == 1 and "not a pass" in failure.message
    done = seen[-1]
    assert isinstance(done, ev.Finished) and done.summary == "0/8 match, 8 unverified (not a pass)"


def test_kind_option_skips_detection_and_a_server_without_score_is_refused() -> None:
    with stand_in(score_status=404) as url, pytest.raises(BadInput, match="no /score endpoint"):
        usage.run(UrlTarget(url), usage.Options(kind="cross-encoder"))
    with stand_in() as url:
        report, _ = check(url, kind="bi-encoder")
    assert report.to_dict()["kind_source"] == "--kind"


def test_typed_errors_unreachable_and_timeout() -> None:
    with pytest.raises(EngineUnreachable, match="no server answered"):
        usage.run(UrlTarget("http://127.0.0.1:9"), usage.Options())
    with stand_in(sleep=3.0) as url, pytest.raises(OpsTimeout, match=r"within 0\.5 s"):
        usage.run(UrlTarget(url), usage.Options(timeout=0.5))


def test_options_and_specs_are_checked_before_any_engine_start(monkeypatch) -> None:
    from opsctl.engine import server

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("an engine was started")

    monkeypatch.setattr(server.EngineServer, "start", boom)
    with pytest.raises(ValueError):
        usage.Options(kind="llm")
    with pytest.raises(ValueError):
        usage.Options(timeout=0)
    with pytest.raises(BadInput, match="--model"):
        usage.run(EngineSpec(), usage.Options())
    with pytest.raises(BadInput, match="diag usage needs a cross-encoder or a bi-encoder"):
        usage.run(EngineSpec(model="tiny-llama"), usage.Options())


def test_a_shared_session_serves_a_url_target() -> None:
    with stand_in() as url, EngineSession() as session:
        seen: list[ev.Event] = []
        report = usage.run(UrlTarget(url), usage.Options(), seen.append, session)
        again = usage.run(UrlTarget(url), usage.Options(), session=session)
    assert report.verdict == again.verdict == "pass" and session.starts == []


def test_knobs_of_an_opsctl_engine_behind_the_url_are_an_alert(tmp_path: Path, monkeypatch) -> None:
    """A URL whose run directory opsctl knows (found by URL, live pid): the knobs its
    ledger records become an Alert event and the report's test_knobs/warnings; the
    document's run_dir stays null for a server the check did not start."""
    from opsctl import paths

    monkeypatch.setattr(paths, "runs_dir", lambda: tmp_path)
    with stand_in() as url:
        run = tmp_path / "run1"
        (run / "ledger").mkdir(parents=True)
        meta = {"url": url, "pid": os.getpid(), "started_at": 1.0}
        (run / "meta.json").write_text(json.dumps(meta))
        record = {"pid": 2, "role": "worker", "time": 2.0, "test_knobs": {knobs.NUDGE: "z:3"}}
        (run / "ledger" / "2.json").write_text(json.dumps(record))
        report, seen = check(url)
    (alert,) = [e for e in seen if isinstance(e, ev.Alert)]
    assert alert.text.startswith("TEST KNOBS active") and f"{knobs.NUDGE}=z:3" in alert.text
    doc = report.to_dict()
    assert doc["test_knobs"] == {knobs.NUDGE: "z:3"} and doc["warnings"] == [alert.text]
    assert report.knob_warning == alert.text and doc["run_dir"] is None
