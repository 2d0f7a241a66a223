"""CLI tests of `opsctl diag mm-uuid` without an engine: bad input, unreachable, and the
judgement wired end to end through a stand-in server that plays the engine and its
probe (it answers chat requests and appends the probe's events to a run directory),
once honest and once rewriting one explicit UUID."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.cli import app


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def write_run_dir(run_dir: Path, probe_status: str = "applied", caches_off: bool = True) -> None:
    (run_dir / "ledger").mkdir(parents=True, exist_ok=True)
    (run_dir / "events").mkdir(exist_ok=True)
    record = {
        "pid": 1,
        "role": "engine_core",
        "time": 1.0,
        "vllm_version": "x",
        "patches": [
            {
                "name": "mm_uuid_probe",
                "status": probe_status,
                "detail": "",
                "reason": "",
                "target": "",
            }
        ],
    }
    (run_dir / "ledger" / "1.json").write_text(json.dumps(record))
    info = {
        "enable_prefix_caching": not caches_off,
        "mm_processor_cache_gb": 0 if caches_off else 4,
    }
    (run_dir / "events" / "engine_info.jsonl").write_text(json.dumps(info) + "\n")


@contextmanager
def stand_in(run_dir: Path, rewrite: str | None = None, caches_off: bool = True) -> Iterator[str]:
    counter = {"n": 0}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": "fake-vlm"}]})
            else:
                self._send(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            part = body["messages"][0]["content"][0]
            counter["n"] += 1
            rid = f"chatcmpl-{counter['n']:04d}"
            uuid = part.get("uuid")
            if uuid is None:
                ident = (
                    f"renderer0-mm-{counter['n']}-image-0"
                    if caches_off
                    else hashlib.sha256(part["image_url"]["url"].encode()).hexdigest()
                )
            else:
                ident = uuid + "~rewritten" if uuid == rewrite else uuid
            event = {
                "request_id": f"{rid}-abcd",
                "items": [{"index": 0, "modality": "image", "identifier": ident}],
            }
            with open(run_dir / "events" / "mm_uuid.jsonl", "a") as fh:
                fh.write(json.dumps(event) + "\n")
            self._send(200, {"id": rid, "choices": [{"message": {"content": ident[:3]}}]})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_honest_engine_passes(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path) as url:
        r = run("diag", "mm-uuid", url, "--run-dir", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.diag.mm_uuid/1" and doc["verdict"] == "pass"
    assert doc["runs"][0]["mode"] == "caches-off"
    by = {(i["case"], i["index"]): i for i in doc["items"]}
    assert by[("all explicit", 0)]["identifier"] == "opsctl-all-0"
    assert by[("some explicit, some None", 1)]["kind"] == "request-local"
    assert by[("empty string", 0)]["identifier"] == ""
    codes = {f["code"]: f["severity"] for f in doc["findings"]}
    assert (
        codes["mm_uuid.empty_string"] == "warning" and codes["mm_uuid.reuse_accepted"] == "warning"
    )


def test_rewritten_uuid_is_caught(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    with stand_in(tmp_path, rewrite="canary-some-0") as url:
        r = run("diag", "mm-uuid", url, "--run-dir", str(tmp_path), "--uuid-prefix", "canary")
    assert r.exit_code == 1
    assert "canary-some-0~rewritten" in r.stdout and "FAIL" in r.stdout
    assert "did not reach the engine core as expected" in r.stderr


def test_caches_on_expects_content_hashes(tmp_path: Path) -> None:
    write_run_dir(tmp_path, caches_off=False)
    with stand_in(tmp_path, caches_off=False) as url:
        r = run("diag", "mm-uuid", url, "--run-dir", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["runs"][0]["mode"] == "caches-on"
    assert {i["kind"] for i in doc["items"] if i["explicit_uuid"] is None} == {"content hash"}
    # a caches-off engine that hashed (or a caches-on one handing out request-local ids) fails
    write_run_dir(tmp_path, caches_off=True)
    with stand_in(tmp_path, caches_off=False) as url:
        r = run("diag", "mm-uuid", url, "--run-dir", str(tmp_path), "--json")
    assert r.exit_code == 1


def test_engine_without_probe_is_bad_input(tmp_path: Path) -> None:
    write_run_dir(tmp_path, probe_status="skipped")
    with stand_in(tmp_path) as url:
        r = run("diag", "mm-uuid", url, "--run-dir", str(tmp_path))
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
        (["--modes", "sometimes"], 2, "--modes"),
        (["--run-dir", "/tmp"], 2, "--run-dir goes with a URL"),
        (["--uuid-prefix", ""], 2, "--uuid-prefix"),
        (["--load-format", "gguf"], 2, "--load-format"),
    ],
)
def test_bad_input_and_unreachable(args, code, text) -> None:
    r = run("diag", "mm-uuid", *args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert text in r.stderr and r.stdout == ""
