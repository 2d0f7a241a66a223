"""opsctl.suite.mm_uuid.run called as a library (no CLI): against the stand-in engine and
probe (tests/standins/mm_uuid.py), the report it returns and the typed progress events it
sends. With an EngineSpec, the two modes are two engines opened through the session; an
EngineServer double serves each from a stand-in in that mode (the real engines:
tests/e2e/test_mm_uuid_e2e.py)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.errors import BadInput, EngineUnreachable, OpsTimeout
from opsctl.suite.mm_uuid import run as mm_uuid
from tests.standins.mm_uuid import stand_in, write_run_dir


def check(url: str, run_dir: Path, **options) -> tuple[mm_uuid.MmUuidReport, list[ev.Event]]:
    seen: list[ev.Event] = []
    opts = mm_uuid.Options(run_dir=run_dir, **options)
    return mm_uuid.run(UrlTarget(url), opts, seen.append), seen


def of(seen: list[ev.Event], kind: type) -> list:
    return [e for e in seen if isinstance(e, kind)]


def test_events_tell_the_check_as_it_runs(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path) as url:
        report, seen = check(url, tmp_path)
    assert isinstance(report, mm_uuid.MmUuidReport) and report.verdict == "pass"
    assert isinstance(seen[0], ev.Started) and seen[0].title == "diag mm-uuid"
    assert isinstance(seen[1], ev.Table) and seen[1].rows == ()
    phases = list(dict.fromkeys(p.name for p in of(seen, ev.Phase)))
    assert phases == [
        "caches-off: all explicit",
        "caches-off: some explicit, some None",
        "caches-off: empty string",
        "caches-off: no UUIDs",
        "caches-off: UUID reuse",
    ]
    items = of(seen, mm_uuid.ItemResult)
    assert len(items) == 7 and {i.verdict for i in items} == {"pass"}
    assert items[0].name == "[caches-off] all explicit #0" and items[0].kind == "kept"
    assert items[0].snapshot() == {
        "events": ["[caches-off] all explicit #0: sent 'opsctl-all-0' -> 'opsctl-all-0' (kept)"]
    }
    assert items[0].detail == "explicit UUID kept"
    reuse = of(seen, ev.Log)
    assert [r.text.split(":")[0] for r in reuse] == [f"[caches-off] reuse #{i}" for i in range(3)]
    done = seen[-1]
    assert isinstance(done, ev.Finished) and done.verdict == "pass"
    assert done.summary == "7/7 items as expected" and done.rows is not None and len(done.rows) == 7
    assert not of(seen, ev.Alert) and not of(seen, ev.EngineStarting)


def test_report_is_the_json_document(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, rewrite="opsctl-all-1") as url:
        report, seen = check(url, tmp_path)
    doc = report.to_dict()
    assert report.schema == "opsctl.diag.mm_uuid/2" and report.verdict == doc["verdict"] == "fail"
    assert list(doc) == [
        "schema",
        "platform",
        "platform_note",
        "vllm_version",
        "runs",
        "uuid_prefix",
        "images_per_request",
        "items",
        "reuse",
        "findings",
        "verdict",
        "test_knobs",
        "warnings",
    ]
    assert doc["runs"] == [
        {
            "mode": "caches-off",
            "url": url,
            "run_dir": str(tmp_path),
            "settings": {"enable_prefix_caching": False, "mm_processor_cache_gb": 0},
            "engine_started": False,
        }
    ]
    (bad,) = report.failed_items
    assert bad["identifier"] == "opsctl-all-1~rewritten" and bad["verdict"] == "fail"
    (failed,) = [i for i in of(seen, mm_uuid.ItemResult) if i.verdict == "fail"]
    assert failed.name == "[caches-off] all explicit #1" and "rewritten" in failed.detail
    assert doc["test_knobs"] == {} and doc["warnings"] == [] and report.knob_warning is None


def test_record_of_another_request_is_not_credited(tmp_path: Path) -> None:
    """No fallback to 'any new probe event': a record filed under another request id
    leaves the item without an identifier, and that is a failure."""
    write_run_dir(tmp_path)
    with stand_in(tmp_path, lose="opsctl-some-0") as url:
        report, _ = check(url, tmp_path, record_wait=0.5)
    assert report.verdict == "fail"
    (it,) = report.failed_items
    assert (it["case"], it["index"]) == ("some explicit, some None", 0)
    assert it["identifier"] is None and it["why"].startswith(
        "no engine record for request chatcmpl-"
    )


def test_knobs_in_the_ledger_are_an_alert(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    record = {"pid": 2, "role": "worker", "time": 2.0, "test_knobs": {knobs.MM_UUID_REWRITE: "x"}}
    (tmp_path / "ledger" / "2.json").write_text(json.dumps(record))
    with stand_in(tmp_path) as url:
        report, seen = check(url, tmp_path)
    (alert,) = of(seen, ev.Alert)
    assert alert.text.startswith("TEST KNOBS active") and report.knob_warning == alert.text
    assert report.to_dict()["warnings"] == [alert.text]


def test_refusals_and_typed_errors(tmp_path: Path) -> None:
    write_run_dir(tmp_path, probe_status="skipped")
    with stand_in(tmp_path) as url:
        with pytest.raises(BadInput, match="probe is not active"):
            check(url, tmp_path)
        with pytest.raises(BadInput, match="no opsctl run directory"):
            mm_uuid.run(UrlTarget(url), mm_uuid.Options())
    with pytest.raises(EngineUnreachable, match="no server answered"):
        mm_uuid.run(UrlTarget("http://127.0.0.1:9"), mm_uuid.Options())
    write_run_dir(tmp_path)
    with stand_in(tmp_path, sleep=3.0) as url, pytest.raises(OpsTimeout, match=r"within 0\.5 s"):
        check(url, tmp_path, timeout=0.5)
    for bad in ({"modes": ()}, {"modes": ("sometimes",)}, {"uuid_prefix": "a b"}):
        with pytest.raises(ValueError):
            mm_uuid.Options(**bad)


def test_mode_specs_never_share_an_engine() -> None:
    spec = EngineSpec(load_format="dummy")
    off, on = (mm_uuid.mode_spec(spec, m, "tiny-vlm-multi") for m in ("caches-off", "caches-on"))
    assert off.model == on.model == "tiny-vlm-multi" and off.probes == on.probes == {"mm_uuid"}
    assert off.extra_args == (
        "--no-enable-prefix-caching",
        "--mm-processor-cache-gb",
        "0",
        "--limit-mm-per-prompt",
        '{"image": 4}',
    )
    assert off.engine_key() != on.engine_key() and off.load_format == "dummy"
    assert mm_uuid.mode_spec(EngineSpec(model="tiny-vlm"), "caches-on", "tiny-vlm").extra_args == (
        "--enable-prefix-caching",
        "--mm-processor-cache-gb",
        "4",
    )


@pytest.fixture
def engines(tmp_path: Path, monkeypatch):
    """EngineServer double: 'starts' an engine by serving a stand-in in the mode its
    arguments ask for (with a run directory the probe writes to); records what was
    started and stopped."""
    from opsctl.engine import server as srv

    log: list[tuple[str, object]] = []
    stack = contextlib.ExitStack()

    class Double:
        def __init__(self, opts) -> None:
            self.opts = opts
            off = "--no-enable-prefix-caching" in opts.extra_args
            self.run_dir = tmp_path / f"{opts.label}-{len(log)}"
            write_run_dir(self.run_dir, caches_off=off)
            self.url = stack.enter_context(
                stand_in(self.run_dir, caches_off=off, model_id=opts.model.name)
            )

        def start(self) -> None:
            log.append(("start", self.opts))

        def wait_healthy(self, timeout: float) -> float:
            return 0.5

        def stop(self, *a, **k):
            log.append(("stop", self.opts.label))
            return srv.StopReport(0.1, [], [], [], [], 0)

    monkeypatch.setattr(srv, "EngineServer", Double)
    with stack:
        yield log


def test_engine_spec_opens_one_engine_per_mode(engines) -> None:
    seen: list[ev.Event] = []
    report = mm_uuid.run(EngineSpec(load_format="dummy"), mm_uuid.Options(), seen.append)
    assert report.verdict == "pass", report.to_dict()["findings"]
    starts = [o for what, o in engines if what == "start"]
    assert [o.label for o in starts] == ["diag-mm-uuid-caches-off", "diag-mm-uuid-caches-on"]
    assert all(o.env == {"OPSCTL_PROBES": "mm_uuid"} and o.load_format == "dummy" for o in starts)
    assert [w for w, _ in engines] == ["start", "stop", "start", "stop"]  # one after the other
    assert len(of(seen, ev.EngineStarting)) == len(of(seen, ev.EngineReady)) == 2
    doc = report.to_dict()
    assert [(r["mode"], r["settings_mode"], r["engine_started"]) for r in doc["runs"]] == [
        ("caches-off", "caches-off", True),
        ("caches-on", "caches-on", True),
    ]
    assert doc["images_per_request"] == 4
    missing_on = [
        i for i in doc["items"] if i["mode"] == "caches-on" and i["explicit_uuid"] is None
    ]
    assert missing_on and {i["kind"] for i in missing_on} == {"content hash"}


def test_a_shared_session_keeps_both_engines_until_it_closes(engines) -> None:
    with EngineSession() as session:
        report = mm_uuid.run(EngineSpec(), mm_uuid.Options(), session=session)
        assert [w for w, _ in engines] == ["start", "start"]
        assert [s.served for s in session.starts] == [
            ["diag-mm-uuid-caches-off"],
            ["diag-mm-uuid-caches-on"],
        ]
    assert [w for w, _ in engines].count("stop") == 2 and report.verdict == "pass"


def test_a_model_that_takes_no_images_is_refused_before_any_start(engines) -> None:
    with pytest.raises(BadInput, match="vision-language"):
        mm_uuid.run(EngineSpec(model="tiny-llama"), mm_uuid.Options())
    assert engines == []
