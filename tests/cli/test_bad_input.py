"""Bad input across every command, table-driven, through the real CLI process: one
"opsctl: error:" line on stderr (plus at most one "hint:" line) and nothing else, the
documented exit code, and nothing left running or written (no new run directory, no
process left in opsctl's process group, no /dev/shm segment its process tree held left)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.standins.base import GuardedHandler, serving
from tests.standins.shm_watch import TreeShm
from tests.standins.vllm_server import StandInFleet

OPSCTL = [sys.executable, "-m", "opsctl"]
USAGE, UNREACHABLE = 2, 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Files and servers the cases point at: a closed port, a port in use, a server that
    wants an API key, an HTTP server that is not vLLM, malformed files."""
    d = tmp_path_factory.mktemp("bad-input")
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "bad.toml").write_text("x = [")
    (d / "badmodel").mkdir()
    (d / "badmodel" / "config.json").write_text('{"architectures": ')
    (d / "nomodel").mkdir()
    (d / "out" / "tiny-llama").mkdir(parents=True)  # a directory opsctl did not build
    (d / "out" / "tiny-llama" / "precious.txt").write_text("keep me")
    (d / "empty-prompts.json").write_text("[]")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    with StandInFleet(["notvllm"]) as fleet, serving(GuardedHandler) as guarded:
        yield {
            "dir": str(d),
            "closed": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "busy_port": str(busy.getsockname()[1]),
            "guarded": guarded,
            "notvllm": fleet.urls[0],
        }
    closed.close()
    busy.close()


# (id, argv with {placeholders}, exit code, words the error line must hold)
CASES = [
    ("serve-missing-model-dir", "serve {dir}/missing --no-tui", USAGE, "does not exist"),
    ("serve-no-config", "serve {dir}/nomodel --no-tui", USAGE, "config.json"),
    ("serve-corrupt-config", "serve {dir}/badmodel --no-tui", USAGE, "not valid JSON"),
    ("serve-unknown-model", "serve no-such-model --no-tui", USAGE, "no-such-model"),
    ("serve-port-in-use", "serve --no-tui --port {busy_port}", USAGE, "already in use"),
    ("serve-port-range", "serve --no-tui --port 70000", USAGE, "out of range"),
    ("serve-load-format", "serve --no-tui --load-format bogus", USAGE, "--load-format"),
    ("serve-timeout", "serve --no-tui --timeout -1", USAGE, "--timeout"),
    ("serve-owned-host", "serve --no-tui -- --host 0.0.0.0", USAGE, "opsctl owns"),
    ("serve-owned-port", "serve --no-tui -- --port=9", USAGE, "opsctl owns"),
    ("serve-owned-key", "serve --no-tui -- --api-key k", USAGE, "opsctl owns"),
    ("serve-wide-bind", "serve --no-tui --host 0.0.0.0", USAGE, "unauthenticated"),
    ("serve-bad-knob", "serve --no-tui --test-knob BOGUS=1", USAGE, "unknown test knob"),
    ("serve-knob-form", "serve --no-tui --test-knob OPSCTL_PROBE_NUDGE", USAGE, "NAME=VALUE"),
    # ranks (issue 44): refused before anything starts, on any machine (the CPU count is
    # judged by test_more_ranks_than_cpus_is_refused_before_anything_starts)
    ("serve-tp-heads", "serve --no-tui --tp 3", USAGE, "4 attention heads"),
    ("serve-tp-twice", "serve --no-tui --tp 2 -- -tp 2", USAGE, "TP size is given twice"),
    ("serve-dp-twice", "serve --no-tui -- --data-parallel-size 2 -dp=2", USAGE, "given twice"),
    ("serve-dp-zero", "serve --no-tui --dp 0", USAGE, "--dp must be at least 1"),
    ("serve-tp-single", "serve --no-tui --tp 2 --single-process", USAGE, "--single-process"),
    (
        "serve-dp-external",
        "serve --no-tui --dp 2 -- --data-parallel-external-lb",
        USAGE,
        "non-MoE models do not support external data parallel",
    ),
    ("inv-ranks-url", "diag invariance {closed} --tp 2", USAGE, "--tp and --dp"),
    ("kv-tp-heads", "diag kv-fail --tp 3", USAGE, "tiny-hybrid has 4 attention heads"),
    ("usage-tp-heads", "diag usage --model tiny-reranker --tp 3", USAGE, "attention heads"),
    ("certify-ranks-url", "certify {closed} --dp 2", USAGE, "--tp and --dp"),
    ("certify-tp-heads", "certify --model tiny-llama --tp 3", USAGE, "attention heads"),
    ("certify-fleet-ranks", "certify {closed} {closed} --tp 2", USAGE, "--tp, --dp"),
    ("status-bad-url", "status notaurl", USAGE, "not an http(s) URL"),
    ("status-bad-port", "status http://127.0.0.1:99999", USAGE, "not a valid URL"),
    ("status-bad-ipv4", "status http://256.1.1.1:9", USAGE, "bad IPv4 address"),
    ("status-timeout", "status {closed} --timeout -1", USAGE, "--timeout"),
    ("status-unreachable", "status {closed}", UNREACHABLE, "no server answered"),
    ("status-no-key", "status {guarded}", UNREACHABLE, "authentication required"),
    ("status-wrong-key", "status {guarded} --api-key wrong", UNREACHABLE, "authentication"),
    ("usage-nothing", "diag usage", USAGE, "URL or --model"),
    ("usage-both", "diag usage {closed} --model tiny-reranker", USAGE, "not both"),
    ("usage-generative", "diag usage --model tiny-llama", USAGE, "cross-encoder"),
    ("usage-timeout", "diag usage --model tiny-reranker --timeout 0", USAGE, "--timeout"),
    ("usage-kind", "diag usage --model tiny-reranker --kind bogus", USAGE, "--kind"),
    ("usage-unreachable", "diag usage {closed}", UNREACHABLE, "no server answered"),
    ("usage-wrong-key", "diag usage {guarded} --api-key nope", UNREACHABLE, "authentication"),
    ("usage-not-vllm", "diag usage {notvllm}", UNREACHABLE, "not a vLLM server"),
    ("usage-knob-url", "diag usage {closed} --test-knob OPSCTL_PROBE_NUDGE=a:1", USAGE, "knob"),
    ("inv-atol", "diag invariance --model tiny-llama --atol -1", USAGE, "--atol"),
    ("inv-batch", "diag invariance --model tiny-llama --batch-size 0", USAGE, "--batch-size"),
    ("inv-negative", "diag invariance --model tiny-llama --max-tokens -3", USAGE, "--max-tokens"),
    ("inv-pooling", "diag invariance --model tiny-reranker", USAGE, "generative"),
    ("inv-prompts", "diag invariance --model tiny-llama --prompts {dir}/missing", USAGE, "prompts"),
    (
        "inv-bad-prompts",
        "diag invariance --model tiny-llama --prompts {dir}/bad.json",
        USAGE,
        "JSON",
    ),
    ("inv-mode", "diag invariance --model tiny-llama --mode sideways", USAGE, "--mode"),
    ("inv-unreachable", "diag invariance {closed}", UNREACHABLE, "no server answered"),
    ("kv-blocks", "diag kv-fail --blocks x:y", USAGE, "blocks spec"),
    ("kv-rate", "diag kv-fail --rate 2", USAGE, "--rate"),
    ("kv-requests", "diag kv-fail --requests -1", USAGE, "--requests"),
    ("kv-policy", "diag kv-fail --policy maybe", USAGE, "unknown policy"),
    ("kv-pooling", "diag kv-fail --model tiny-reranker", USAGE, "tiny-reranker"),
    ("mm-unreachable", "diag mm-uuid {closed}", UNREACHABLE, "no server answered"),
    ("runs-duration", "runs clean --older-than 5x", USAGE, "not a duration"),
    ("engram-min-age", "engram clean --min-age bogus", USAGE, "not a duration"),
    ("engram-config-missing", "engram plan --config {dir}/missing.json", USAGE, "no such config"),
    ("engram-config-corrupt", "engram plan --config {dir}/bad.json", USAGE, "not valid JSON"),
    ("engram-config-list", "engram plan --config {dir}/list.json", USAGE, "JSON object"),
    ("engram-tp", "engram plan --config deepseek-v4.1-flash --tp 0", USAGE, "--tp"),
    ("models-foreign-dir", "models build tiny-llama --out {dir}/out", USAGE, "not built by opsctl"),
    ("models-unknown", "models build no-such-model", USAGE, "no-such-model"),
    ("patches-missing-run", "patches --run {dir}/missing", USAGE, "does not exist"),
    ("console-targets-missing", "console --once --targets {dir}/missing.toml", USAGE, "targets"),
    ("console-targets-corrupt", "console --once --targets {dir}/bad.toml", USAGE, "TOML"),
    ("console-interval", "console --once --no-discover --interval 0", USAGE, "--interval"),
]


@pytest.fixture
def home(tmp_path) -> Path:
    """A private OPSCTL_HOME (its runs/ must stay empty) sharing the built models."""
    shared = Path(os.environ["OPSCTL_HOME"]) / "models"
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / "models").symlink_to(shared)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_line_the_documented_code_and_leaves_nothing(
    world, home, argv, code, words
):
    env = {**os.environ, "OPSCTL_HOME": str(home), "OPSCTL_ENGINE_LOCK": "", "VLLM_API_KEY": ""}
    proc = subprocess.Popen(
        [*OPSCTL, *argv.format(**world).split()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: whatever it spawned is findable
    )
    with TreeShm(proc.pid) as watch:  # the segments its own tree holds, if any
        out, err = proc.communicate(timeout=180)
    lines = err.splitlines()
    assert proc.returncode == code, err
    assert len(lines) in (1, 2), err
    assert lines[0].startswith("opsctl: error: ") and words in lines[0], err
    assert len(lines) == 1 or lines[1].startswith("hint: "), err
    if argv.startswith("status ") and code == UNREACHABLE:
        # like systemctl status: the state found is the result, on stdout (issue 23)
        assert any(line.split()[:2] in (["state", "unreachable"], ["state", "unauthorized"])
                   for line in out.splitlines()), out  # fmt: skip
    else:
        assert out == "", out
    left = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == proc.pid and p.pid != proc.pid]
    assert left == [], left
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []
    assert watch.left() == set(), watch.left()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_the_table_covers_every_command_group():
    groups = {c[1].split()[0] for c in CASES}
    assert {"serve", "status", "diag", "runs", "engram", "models", "patches", "console"} <= groups
    assert len(CASES) >= 25
    assert json.dumps(CASES)  # plain data, printable in a report


def test_a_refused_model_build_leaves_the_foreign_directory_as_it_was(world):
    out = Path(world["dir"]) / "out"
    for extra in ([], ["--force"]):
        r = subprocess.run(
            [*OPSCTL, "models", "build", "tiny-llama", "--out", str(out), *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == USAGE, r.stderr
    assert sorted(p.name for p in (out / "tiny-llama").iterdir()) == ["precious.txt"]
    assert (out / "tiny-llama" / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("cpus", "argv"),
    [("0", "serve --no-tui --tp 2"), ("0", "diag invariance --dp 2"), ("0,1", "serve --dp 3")],
)
def test_more_ranks_than_cpus_is_refused_before_anything_starts(home, cpus, argv):
    """The CPUs are those opsctl may use (its affinity, as taskset sets it)."""
    usable = sorted(os.sched_getaffinity(0))
    picked = [int(c) for c in cpus.split(",")]
    if not set(picked) <= set(usable):
        pytest.skip(f"needs CPUs {cpus}; this process may use {usable}")
    env = {**os.environ, "OPSCTL_HOME": str(home), "OPSCTL_ENGINE_LOCK": ""}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    proc = subprocess.run(
        ["taskset", "-c", cpus, *OPSCTL, *argv.split()],
        capture_output=True, text=True, env=env, timeout=120, start_new_session=True,
    )  # fmt: skip
    lines = proc.stderr.splitlines()
    assert proc.returncode == USAGE, proc.stderr
    assert (
        lines[0].startswith("opsctl: error: ")
        and f"may use {len(picked)} ({cpus.replace(',', '-')})" in lines[0]
    ), proc.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: "), proc.stderr
    assert proc.stdout == ""
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []
