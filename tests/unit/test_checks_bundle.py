"""`runs.bundle/2` field names (issue 23: units in names, one name per fact): the
document and the archive's MANIFEST.json match the shipped schema, sizes are
``size_bytes``/``size_on_disk_bytes``, and the host's OS string is ``host_os`` in
environment.json (``platform`` names vLLM's device platform in every other report).

A real run directory on disk (meta.json, server.log, a ledger record) whose process is
gone, bundled without asking any server: real files, a real tar.gz. The live-process
cases are in tests/unit/test_bundle.py."""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

import jsonschema
import pytest

from opsctl.checks import bundle

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def validate(doc: dict) -> None:
    name, version = doc["schema"].removeprefix("opsctl.").split("/")
    schema = json.loads((SCHEMAS / f"opsctl.{name}-{version}.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)


@pytest.fixture
def dead_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "20260101-000000-serve-tiny-llama-1"
    (run / "ledger").mkdir(parents=True)
    meta = {"url": "http://127.0.0.1:9", "pid": 2**22 + 7, "started_at": time.time() - 60}
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "server.log").write_text("INFO engine started\n" * 50)
    rec = {"pid": 2**22 + 7, "role": "engine_core", "platform": "cpu", "time": time.time()}
    (run / "ledger" / "1.json").write_text(json.dumps(rec))
    return run


def test_document_and_manifest_match_the_schema_with_units_in_names(dead_run, tmp_path):
    out = tmp_path / "b.tar.gz"
    opts = bundle.Options(run=dead_run.name, out=out, runs_dir=dead_run.parent, fetch=False)
    doc = bundle.bundle(opts).to_dict()
    assert doc["schema"] == "opsctl.runs.bundle/2"
    validate(doc)
    assert doc["size_bytes"] == out.stat().st_size and "bytes" not in doc
    files = {f["name"]: f for f in doc["files"]}
    log = files["server.log"]
    assert (
        log["size_bytes"] == log["size_on_disk_bytes"] == (dead_run / "server.log").stat().st_size
    )
    assert "bytes" not in log and "size_on_disk" not in log
    assert files["collected/environment.json"]["size_bytes"] > 0
    with tarfile.open(out) as tar:
        member = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        manifest = json.loads(tar.extractfile(member["MANIFEST.json"]).read())
        env = json.loads(tar.extractfile(member["collected/environment.json"]).read())
    validate(manifest)  # the same document before the archive existed: no out, no size
    assert "out" not in manifest and manifest["files"] == doc["files"]
    versions = env["versions"]
    assert "platform" not in versions and versions["host_os"] and versions["python"]
