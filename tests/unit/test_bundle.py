"""`opsctl runs bundle`: redaction rules (pure), and the library and the CLI over run
directories whose "engine" is a real process (the admin stand-in, run with secrets in its
environment, its argv and its log): contents while it lives (metrics, /server_info,
its environment from /proc), after it died, and without dev mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from opsctl.checks import bundle
from opsctl.cli import app
from opsctl.domain import redact

REPO = Path(__file__).resolve().parents[2]
SECRETS = {
    "VLLM_API_KEY": "sk-live-secret-123",
    "HF_TOKEN": "hf_abcdefghijkl",
    "DB_PASSWORD": "hunter2hunter2",
    "MY_CLIENT_SECRET": "s3cr3t-value-x",
}
runner = CliRunner()


# ---- pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [("VLLM_API_KEY", True), ("HF_TOKEN", True), ("pgpassword", True), ("AWS_SECRET", True),
     ("GCP_CREDENTIALS", True), ("PATH", False), ("VLLM_CPU_KVCACHE_SPACE", False)],
)  # fmt: skip
def test_secret_names(name, secret):
    assert redact.is_secret_name(name) is secret


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("'api_key': ['sk-1'], 'tokenizer': '/t'", "'api_key': ['<redacted>'], 'tokenizer': '/t'"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer <redacted>"),
        ("HF_TOKEN=hf_x other=1", "HF_TOKEN=<redacted> other=1"),
        ('"password": "pw", "key_len": 3', '"password": "<redacted>", "key_len": 3'),
        ("max_tokens=16 token_ids=[1,2] num_tokens 3", "max_tokens=16 token_ids=[1,2] num_tokens 3"),
    ],
)  # fmt: skip
def test_redact_text_spellings(text, want):
    assert redact.redact_text(text)[0] == want


def test_secret_values_and_argv():
    env = {"VLLM_API_KEY": "sekrit-1", "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}
    argv = ["--model", "m", "--api-key", "abcdef1", "--hf-token=hf_zzzzzz"]
    assert redact.secret_values(env, argv) == {"sekrit-1", "abcdef1", "hf_zzzzzz"}
    assert redact.redact_argv(argv) == [
        "--model", "m", "--api-key", "<redacted>", "--hf-token=<redacted>"
    ]  # fmt: skip
    text, n = redact.redact_text("key sekrit-1 twice sekrit-1; false stays", {"sekrit-1"})
    assert text == "key <redacted> twice <redacted>; false stays" and n == 2


# ---- the library over a run with a live "engine" ---------------------------------------


def _start_run(runs: Path, name: str, dev: bool = True) -> tuple[Path, subprocess.Popen]:
    run = runs / name
    (run / "ledger").mkdir(parents=True)
    (run / "events").mkdir()
    (run / "ledger" / "1.json").write_text(json.dumps({"pid": 1, "patches": []}))
    (run / "events" / "lifetime.jsonl").write_text('{"event": "start"}\n')
    env = {**os.environ, **SECRETS, "PYTHONPATH": str(REPO)}
    log = (run / "server.log").open("w")
    args = [sys.executable, "-m", "tests.standins.admin", *(["--dev"] if dev else [])]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    url = None
    while url is None:
        assert time.monotonic() < deadline and proc.poll() is None, "stand-in did not start"
        for line in (run / "server.log").read_text().splitlines():
            if line.startswith('{"url"'):
                url = json.loads(line)["url"]
        time.sleep(0.05)
    me = psutil.Process()
    meta = {
        "url": url, "pid": proc.pid, "model": "tiny-llama", "started_at": time.time(),
        "owner_pid": me.pid, "owner_started": me.create_time(),
        "pids": {str(proc.pid): psutil.Process(proc.pid).create_time()},
        "argv": ["python", "-m", "vllm", "--api-key", SECRETS["VLLM_API_KEY"], "--port", "1"],
    }  # fmt: skip
    (run / "meta.json").write_text(json.dumps(meta))
    return run, proc


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _no_secret_anywhere(members: dict[str, bytes]) -> None:
    for name, data in members.items():
        for value in SECRETS.values():
            assert value.encode() not in data, f"{value} leaked in {name}"


@pytest.fixture
def live_run(tmp_path):
    run, proc = _start_run(tmp_path / "runs", "20260101-000000-serve-tiny-llama-1")
    yield run, proc
    proc.kill()
    proc.wait()


def test_bundle_of_a_live_run_holds_everything_and_no_secret(live_run, tmp_path):
    run, proc = live_run
    out = tmp_path / "b.tar.gz"
    view = {"state": "ready", "url": "x", "api_key": SECRETS["VLLM_API_KEY"]}
    opts = bundle.Options(run=run.name, out=out, runs_dir=run.parent, console_view=view)
    report = bundle.bundle(opts)
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.runs.bundle/2"
    assert (
        doc["state"] == "live" and doc["missing"] == [] and doc["size_bytes"] == out.stat().st_size
    )
    m = _members(out)
    top = run.name
    want = {"MANIFEST.json", "meta.json", "server.log", "ledger/1.json", "events/lifetime.jsonl",
            "collected/state.json", "collected/metrics.txt", "collected/server_info.json",
            "collected/console.json", "collected/environment.json",
            "collected/stacks.json", "collected/processes.json",
            "collected/deaths.json"}  # fmt: skip
    assert set(m) == {f"{top}/{n}" for n in want}
    stacks = json.loads(m[f"{top}/collected/stacks.json"])  # taken now, of the live tree
    assert stacks["schema"] == "opsctl.stacks/2" and stacks["pid"] == proc.pid
    assert [p["pid"] for p in stacks["processes"]] == [proc.pid]
    assert stacks["processes"][0]["threads"], stacks["processes"][0]  # py-spy read it
    assert b"vllm:num_requests_running" in m[f"{top}/collected/metrics.txt"]
    assert json.loads(m[f"{top}/collected/server_info.json"])["standin"] is True
    env = json.loads(m[f"{top}/collected/environment.json"])
    assert env["engine_source"] == f"/proc/{proc.pid}/environ"
    for name in SECRETS:
        assert env["engine"][name] == "<redacted>"
    assert env["engine"]["PYTHONPATH"] == str(REPO) and env["versions"]["vllm"]
    meta = json.loads(m[f"{top}/meta.json"])
    assert meta["argv"][3:5] == ["--api-key", "<redacted>"] and meta["pid"] == proc.pid
    log = m[f"{top}/server.log"].decode()
    assert "'api_key': ['<redacted>']" in log and "Bearer <redacted>" in log
    assert "'tokenizer': '/models/tok'" in log  # not a secret: kept
    assert json.loads(m[f"{top}/MANIFEST.json"])["redactions"] == doc["redactions"] >= 4
    _no_secret_anywhere(m)


def test_bundle_after_the_engine_died_says_what_it_could_not_get(live_run, tmp_path):
    run, proc = live_run
    proc.kill()
    proc.wait()
    out = tmp_path / "dead.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(run), out=out)).to_dict()  # a path works too
    assert doc["state"] == "dead"
    whys = {m["what"]: m["why"] for m in doc["missing"]}
    assert whys["metrics.txt"] == whys["server_info.json"] == "no engine process alive (dead)"
    assert whys["stacks.json"] == "no engine process alive (dead)"
    m = _members(out)
    env = json.loads(m[f"{run.name}/collected/environment.json"])
    assert env["engine"] is None and "has exited" in env["engine_source"]
    _no_secret_anywhere(m)


def test_bundle_without_dev_mode_explains_server_info(tmp_path):
    run, proc = _start_run(tmp_path / "runs", "r-nodev", dev=False)
    try:
        doc = bundle.bundle(
            bundle.Options(run="r-nodev", out=tmp_path / "n.tar.gz", runs_dir=run.parent)
        ).to_dict()
    finally:
        proc.kill()
        proc.wait()
    (miss,) = doc["missing"]
    assert miss["what"] == "server_info.json" and "VLLM_SERVER_DEV_MODE=1" in miss["why"]
    assert any(f["name"] == "collected/metrics.txt" for f in doc["files"])


# ---- CLI ---------------------------------------------------------------------------------


def test_cli_bundle_json_and_unknown_run(live_run, tmp_path, monkeypatch):
    run, _ = live_run
    monkeypatch.setenv("OPSCTL_HOME", str(run.parent.parent))
    (run.parent.parent / "runs").exists()
    out = tmp_path / "cli.tar.gz"
    r = runner.invoke(app, ["runs", "bundle", run.name, "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.runs.bundle/2" and doc["out"] == str(out) and out.is_file()
    r = runner.invoke(app, ["runs", "bundle", run.name, "--out", str(out), "--no-fetch"])
    assert r.exit_code == 0 and "not asked" in r.stdout and "redacted" in r.stdout
    r = runner.invoke(app, ["runs", "bundle", "no-such-run"])
    assert r.exit_code == 2 and "no run directory 'no-such-run'" in r.stderr
