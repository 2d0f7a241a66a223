"""CLI tests of `opsctl diag mm-uuid` without an engine: bad input, unreachable, exit
codes, rendering, and the judgement wired end to end through a stand-in server that
plays the engine and its probe (tests/standins/mm_uuid.py), honest and with faults. The
check itself, called without the CLI: tests/unit/test_checks_mm_uuid.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from tests.standins.diag_app import run_diag_app
from tests.standins.mm_uuid import stand_in, write_run_dir


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_honest_engine_passes(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.diag.mm_uuid/2" and doc["verdict"] == "pass"
    assert doc["runs"][0]["mode"] == "caches-off"
    by = {(i["case"], i["index"]): i for i in doc["items"]}
    assert by[("all explicit", 0)]["identifier"] == "opsctl-all-0"
    assert by[("some explicit, some None", 1)]["kind"] == "request-local"
    assert by[("empty string", 0)]["identifier"] == ""
    codes = {f["code"]: f["severity"] for f in doc["findings"]}
    assert (
        codes["mm_uuid.empty_string"] == "warning" and codes["mm_uuid.reuse_accepted"] == "warning"
    )
    # the one-image-per-prompt limitation is stated in the report
    assert codes["mm_uuid.one_image_per_request"] == "info" and doc["images_per_request"] == 1
    assert all(i["sent_items"] == 1 and i["engine_items"] == 1 for i in doc["items"])


def test_rewritten_uuid_is_caught(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, rewrite="canary-some-0") as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--uuid-prefix", "canary")
    assert r.exit_code == 1
    assert "canary-some-0~rewritten" in r.stdout and "FAIL" in r.stdout
    assert "did not reach the engine core as expected" in r.stderr


def test_caches_on_expects_content_hashes(tmp_path: Path) -> None:
    write_run_dir(tmp_path, caches_off=False)
    with stand_in(tmp_path, caches_off=False) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["runs"][0]["mode"] == "caches-on"
    assert {i["kind"] for i in doc["items"] if i["explicit_uuid"] is None} == {"content hash"}
    # a caches-off engine that hashed (or a caches-on one handing out request-local ids) fails
    write_run_dir(tmp_path, caches_off=True)
    with stand_in(tmp_path, caches_off=False) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 1


def test_engine_without_probe_is_bad_input(tmp_path: Path) -> None:
    write_run_dir(tmp_path, probe_status="skipped")
    with stand_in(tmp_path) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path))
        assert r.exit_code == 2 and "probe is not active" in r.stderr
        r = run("diag", "mm-uuid", url)  # no run dir known for this URL
        assert r.exit_code == 2 and "no opsctl run directory" in r.stderr


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["not a url"], 2, "URL"),
        (["http://127.0.0.1:9"], 3, "no server answered"),
        (["http://127.0.0.1:9", "--model", "tiny-vlm"], 2, "not both"),
        (["--model", "tiny-llama"], 2, "vision-language"),
        (["--model", "tiny-reranker"], 2, "vision-language"),
        (["--mode", "sometimes"], 2, "--mode takes"),
        (["--modes", "sometimes"], 2, "--mode takes"),  # the hidden old name
        (["--run", "/tmp"], 2, "--run goes with a URL"),
        (["--uuid-prefix", ""], 2, "--uuid-prefix"),
        (["--load-format", "gguf"], 2, "--load-format"),
    ],
)
def test_bad_input_and_unreachable(args, code, text) -> None:
    r = run("diag", "mm-uuid", *args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert text in r.stderr and r.stdout == ""


def by_item(doc: dict) -> dict:
    return {(i["case"], i["index"]): i for i in doc["items"]}


def test_wrong_request_local_index_is_caught(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, index_offset=1) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 1
    it = by_item(json.loads(r.stdout))[("some explicit, some None", 1)]
    assert it["identifier"].endswith("-image-1") and it["verdict"] == "fail"
    assert "expected one ending in '-image-0'" in it["why"]


def test_extra_item_in_the_engine_record_is_caught(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, extra_item=True) as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert all(i["engine_items"] == 2 and i["verdict"] == "fail" for i in doc["items"])
    assert "saw 2 item(s) for a request of 1" in doc["items"][0]["why"]


def test_images_per_request_is_a_property_of_the_model() -> None:
    from opsctl.suite.mm_uuid import run as M

    assert M.images_per_request("tiny-vlm-multi") == 4 and M.images_per_request("tiny-vlm") == 1
    assert M.images_per_request("some-model-dir") == 1
    assert M.model_args("tiny-vlm-multi") == ["--limit-mm-per-prompt", '{"image": 4}']
    assert M.model_args("tiny-vlm") == []
    assert M.DEFAULT_MODEL == "tiny-vlm-multi"


def test_several_images_per_request_matched_by_position(tmp_path: Path) -> None:
    """Against a multi-image model (served as tiny-vlm-multi) each case goes out as ONE
    request and every recorded item is matched by position; a UUID moved to another item
    (records in reverse order) is caught."""
    write_run_dir(tmp_path)
    with stand_in(tmp_path, model_id="tiny-vlm-multi") as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    it = by_item(doc)
    some0, some1 = it[("some explicit, some None", 0)], it[("some explicit, some None", 1)]
    assert some0["request_id"] == some1["request_id"] and some0["sent_items"] == 2
    assert some0["identifier"] == "opsctl-some-0" and some1["identifier"].endswith("-image-1")
    assert doc["images_per_request"] == 4
    assert "mm_uuid.one_image_per_request" not in {f["code"] for f in doc["findings"]}
    write_run_dir(tmp_path)
    with stand_in(tmp_path, swap=True, model_id="tiny-vlm-multi") as url:
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--json")
    assert r.exit_code == 1
    it = by_item(json.loads(r.stdout))
    assert it[("some explicit, some None", 0)]["verdict"] == "fail"  # got the other's id
    assert it[("all explicit", 0)]["why"] == (
        "explicit UUID 'opsctl-all-0' rewritten to 'opsctl-all-1'"
    )


def test_timeout_exits_4(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, sleep=3.0) as url:
        t0 = time.monotonic()
        r = run("diag", "mm-uuid", url, "--run", str(tmp_path), "--timeout", "0.5")
    assert r.exit_code == 4, (r.stdout, r.stderr)
    assert "no answer within 0.5 s" in r.stderr and r.stdout == ""
    assert time.monotonic() - t0 < 10


def test_find_run_dir_needs_a_live_pid(tmp_path: Path) -> None:
    import os

    from opsctl.collectors.runs import find_run_dir

    url = "http://127.0.0.1:8123"
    for name, pid, started in (
        ("dead", 2**22 + 7, 30.0),
        ("old", os.getpid(), 10.0),
        ("new", os.getpid(), 20.0),
    ):
        (tmp_path / name).mkdir()
        meta = {"url": url, "pid": pid, "started_at": started}
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    # newest live one; the dead one is skipped
    assert find_run_dir(url, root=tmp_path) == tmp_path / "new"
    assert find_run_dir("http://127.0.0.1:9", root=tmp_path) is None


def test_live_panel_shows_the_identifier_table(tmp_path: Path) -> None:
    """--tui feeds the check's events into the reusable DiagPanel (Pilot)."""
    from opsctl.checks.target import UrlTarget
    from opsctl.suite.mm_uuid import run as mm_uuid

    write_run_dir(tmp_path)

    with stand_in(tmp_path, rewrite="canary-all-1") as url:
        options = mm_uuid.Options("canary", run_dir=tmp_path)
        last, app = run_diag_app(
            "diag mm-uuid",
            lambda progress: mm_uuid.run(UrlTarget(url), options, progress),
            (180, 50),
            300,
        )
    assert app.error is None and app.report is not None and app.report.verdict == "fail"
    assert last["verdict"] == "fail" and len(last["rows"]) == 7
    bad = [row for row in last["rows"] if row[-1] == "FAIL"]
    assert len(bad) == 1 and bad[0][5] == "canary-all-1~rewritten"
