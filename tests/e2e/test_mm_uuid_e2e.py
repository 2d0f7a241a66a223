"""`opsctl diag mm-uuid` against real vLLM CPU engines (tiny-vlm-multi, Idefics3: several
images per prompt). Three engine starts in this module:

- the command with ``--model tiny-vlm-multi`` (real seeded weights) starts two engines
  itself, caches off (prefix caching off, mm_processor_cache_gb 0) and caches on, with the
  engine-core probe; each case goes out as ONE request, explicit UUIDs must arrive
  unchanged in both modes, missing ones get request-local ids ending in ``-image-<their
  index in the request>`` (off; vLLM PR 56432: an explicit UUID at index 0 next to a
  missing one at index 1) or content hashes (on), and a reused UUID is a warning;
- one engine from the session pool (``--load-format dummy``, caches off; the tests only
  read from it, tests/engine_pool.py) whose probe has the
  test-only rewrite knob armed for one UUID (``canary-all-0``): a run with the default
  prefix passes on it, a run with ``--uuid-prefix canary`` must fail (exit 1), and so
  must the library call (opsctl.suite.mm_uuid.run.run) with that prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.cli import app
from opsctl.collectors.ledger import entries, read_events, read_records
from opsctl.suite.mm_uuid import run as mm_uuid
from opsctl.suite.mm_uuid.run import CACHE_ARGS, model_args
from tests.opsctl_run import opsctl_json

pytestmark = [pytest.mark.engine, pytest.mark.pool("mm-uuid-rewrite")]
CANARY = "canary-all-0"
MODEL = "tiny-vlm-multi"


@pytest.fixture(scope="module")
def report() -> dict:
    return opsctl_json("diag", "mm-uuid", "--model", MODEL, "--json", timeout=1200)


@pytest.fixture(scope="module")
def rewriting_engine(engine_pool):
    spec = EngineSpec(
        MODEL,
        load_format="dummy",
        extra_args=(*CACHE_ARGS["caches-off"], *model_args(MODEL)),
        probes=frozenset({"mm_uuid"}),
        knobs=((knobs.MM_UUID_REWRITE, CANARY),),  # a knob only ever reaches an engine this way
        timeout=400.0,
    )
    return engine_pool.engine("mm-uuid-rewrite", spec)


def items(doc: dict, mode: str) -> dict:
    return {(i["case"], i["index"]): i for i in doc["items"] if i["mode"] == mode}


def test_caches_off_keeps_explicit_uuids(report) -> None:
    assert report["schema"] == "opsctl.diag.mm_uuid/2" and report["verdict"] == "pass"
    assert [r["mode"] for r in report["runs"]] == ["caches-off", "caches-on"]
    off = report["runs"][0]
    assert off["settings"] == {"enable_prefix_caching": False, "mm_processor_cache_gb": 0.0}
    it = items(report, "caches-off")
    assert report["images_per_request"] == 4
    assert it[("all explicit", 0)]["identifier"] == "opsctl-all-0"
    assert it[("all explicit", 1)]["identifier"] == "opsctl-all-1"
    # the mixed case is ONE request of two images: the explicit UUID at index 0 is kept
    # while the missing one at index 1 gets the request-local id ending in -image-1
    some0, some1 = it[("some explicit, some None", 0)], it[("some explicit, some None", 1)]
    assert some0["request_id"] == some1["request_id"] is not None
    assert some0["sent_items"] == some0["engine_items"] == 2
    assert (some0["position"], some1["position"]) == (0, 1)
    assert some0["identifier"] == "opsctl-some-0" and some0["kind"] == "kept"
    assert some1["kind"] == "request-local" and some1["identifier"].endswith("-image-1")
    none0, none1 = it[("no UUIDs", 0)], it[("no UUIDs", 1)]
    assert none0["request_id"] == none1["request_id"] != some0["request_id"]
    assert none0["identifier"].endswith("-image-0") and none1["identifier"].endswith("-image-1")
    local = [some1, none0, none1]
    assert all(i["kind"] == "request-local" for i in local)
    assert len({i["identifier"] for i in local}) == 3
    assert it[("empty string", 0)]["identifier"] == ""  # '' is explicit: kept as is
    # every request reached the engine core with all of its images
    assert all(i["sent_items"] == i["engine_items"] for i in report["items"])
    assert "mm_uuid.one_image_per_request" not in {f["code"] for f in report["findings"]}
    # the probe really ran in the engine core and recorded it in the run directory
    run_dir = Path(off["run_dir"])
    probe = [e for e in entries(read_records(run_dir)) if e.name == "mm_uuid_probe"]
    assert {e.role: e.status for e in probe}["engine_core"] == "applied"
    recorded = {i["identifier"] for ev in read_events(run_dir, "mm_uuid") for i in ev["items"]}
    assert {"opsctl-all-0", "opsctl-all-1", "opsctl-some-0", ""} <= recorded


def test_caches_on_gives_content_hashes(report) -> None:
    on = report["runs"][1]
    assert (
        on["settings"]["enable_prefix_caching"] is True
        and on["settings"]["mm_processor_cache_gb"] > 0
    )
    it = items(report, "caches-on")
    assert it[("all explicit", 0)]["identifier"] == "opsctl-all-0"
    hashed = [it[("some explicit, some None", 1)], it[("no UUIDs", 0)], it[("no UUIDs", 1)]]
    assert all(i["kind"] == "content hash" for i in hashed)
    assert (
        it[("no UUIDs", 1)]["identifier"] == it[("some explicit, some None", 1)]["identifier"]
    )  # both green
    assert it[("no UUIDs", 0)]["identifier"] != it[("no UUIDs", 1)]["identifier"]  # red != green


def test_reused_uuid_is_a_warning(report) -> None:
    warn = [f for f in report["findings"] if f["code"] == "mm_uuid.reuse_accepted"]
    assert [f["severity"] for f in warn] == ["warning", "warning"]
    for mode in ("caches-off", "caches-on"):
        first, second, fresh = [r for r in report["reuse"] if r["mode"] == mode]
        assert first["status"] == second["status"] == 200
        assert first["identifier"] == second["identifier"] == "opsctl-reused"
        assert fresh["identifier"] != "opsctl-reused"
    assert {f["code"] for f in report["findings"] if f["severity"] == "fail"} == set()


def test_probe_rewrite_is_caught(rewriting_engine) -> None:
    ok = CliRunner().invoke(app, ["diag", "mm-uuid", rewriting_engine.url, "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["runs"][0]["mode"] == "caches-off"
    bad = CliRunner().invoke(
        app, ["diag", "mm-uuid", rewriting_engine.url, "--uuid-prefix", "canary", "--json"]
    )
    assert bad.exit_code == 1, bad.output
    doc = json.loads(bad.stdout)
    it = items(doc, "caches-off")
    assert it[("all explicit", 0)]["identifier"] == CANARY + "~rewritten"
    assert it[("all explicit", 0)]["verdict"] == "fail"
    assert it[("all explicit", 1)]["verdict"] == "pass"  # only the armed UUID was touched
    assert [f["code"] for f in doc["findings"] if f["severity"] == "fail"] == ["mm_uuid.rewritten"]
    detail = [
        e.detail
        for e in entries(read_records(rewriting_engine.run_dir))
        if e.name == "mm_uuid_probe" and e.role == "engine_core"
    ]
    assert detail and "TEST KNOB" in detail[0]
    # the report says so on top, from the engine's own ledger
    assert doc["test_knobs"] == {knobs.MM_UUID_REWRITE: CANARY}
    assert doc["warnings"][0].startswith("TEST KNOBS active") and CANARY in doc["warnings"][0]
    assert "warning: TEST KNOBS active" in bad.stderr


def test_library_call_catches_the_rewrite(rewriting_engine) -> None:
    seen: list[ev.Event] = []
    report = mm_uuid.run(
        UrlTarget(rewriting_engine.url), mm_uuid.Options(uuid_prefix="canary"), seen.append
    )
    assert report.verdict == "fail"
    (bad,) = report.failed_items
    assert bad["identifier"] == CANARY + "~rewritten" and bad["mode"] == "caches-off"
    failed = [e for e in seen if isinstance(e, mm_uuid.ItemResult) and e.verdict == "fail"]
    assert [e.name for e in failed] == ["[caches-off] all explicit #0"]
    (alert,) = [e for e in seen if isinstance(e, ev.Alert)]
    assert alert.text.startswith("TEST KNOBS active") and report.knob_warning == alert.text
