"""`opsctl serve` end to end on the real vLLM CPU engine: dummy and real weights,
health, the patch ledger from every vLLM process, `status`, clean shutdown (SIGTERM and
Ctrl-C) with no process and none of the /dev/shm segments its engine held left (its own
tree watched, tests.standins.shm_watch: never the machine's /dev/shm), engine death and bad
input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from engine_patches import knobs
from opsctl.collectors import shm
from opsctl.collectors.ledger import read_events, read_records
from opsctl.collectors.processes import classify
from opsctl.engine.server import free_port
from tests.conftest import OPSCTL, running_engine
from tests.opsctl_run import read_event
from tests.standins.shm_watch import TreeShm
from tests.waiting import wait_until

pytestmark = pytest.mark.engine


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*OPSCTL, "serve", "--no-tui", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ) if env is None else env,
    )


def json_documents(text: str) -> list:
    """Every JSON document on ``text`` (JSON lines and indented documents alike)."""
    decoder, docs, rest = json.JSONDecoder(), [], text.strip()
    while rest:
        doc, end = decoder.raw_decode(rest)
        docs.append(doc)
        rest = rest[end:].lstrip()
    return docs


def role_pids(ready: dict) -> dict[str, int]:
    """role -> pid of serve's ready event (opsctl.serve/3: a list, in rank order)."""
    return {p["role"]: p["pid"] for p in ready["pids"]}


def gone(pids) -> bool:
    return not [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def shm_names() -> set[str]:
    return {f.name for f in shm.list_files()}


def run_watched(args: list[str], timeout: float, env: dict[str, str]):
    """``subprocess.run`` of ``args`` with its process tree's /dev/shm segments watched
    (tests.standins.shm_watch): (the completed process, the watch)."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    with TreeShm(proc.pid) as watch:
        out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(args, proc.returncode, out, err), watch


def left_in(tmpdir) -> list:
    """What an engine left in its owner's $TMPDIR, but for torch's compile cache (kept
    there on purpose: it outlives one engine)."""
    return sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_"))


@contextlib.contextmanager
def served(*args: str, env: dict[str, str] | None = None):
    """``opsctl serve`` in a child process, its tree's /dev/shm segments watched
    (``proc.shm``: tests.standins.shm_watch.TreeShm) while it runs."""
    proc = start_cli(*args, env=env)
    try:
        with TreeShm(proc.pid) as watch:
            proc.shm = watch  # type: ignore[attr-defined]
            yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def stop_and_check(proc, ready: dict, sig: int) -> dict:
    pids = [p["pid"] for p in ready["pids"]]
    t0 = time.time()
    proc.send_signal(sig)
    rc = proc.wait(30)
    stopped = read_event(proc, 5)
    assert rc == 0, proc.stderr.read()
    assert time.time() - t0 < 15
    assert stopped["event"] == "stopped" and stopped["leftover_pids"] == []
    assert gone(pids), f"left behind: {[p for p in pids if psutil.pid_exists(p)]}"
    assert proc.shm.left() == set(), proc.shm.left()  # what its engine held is gone
    return stopped


def test_serve_dummy_weights_api_key_ledger_knobs_status_and_sigterm():
    """`serve --api-key K` with dummy weights, from a shell that exports every test knob
    (and the enabling switch): the server is up with its three processes, /v1 needs the
    key, the plugin ran in every vLLM process and recorded what it did, no engine process
    sees or honours a knob (ledger test_knobs {} everywhere, nothing in
    /proc/PID/environ, the probes that would use them record none), opsctl's own status
    uses the key (and says so without it), and SIGTERM leaves nothing. One start for what
    were two tests with the same setup (dummy weights, SIGTERM)."""
    key = "e2e-" + os.urandom(6).hex()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env.update(
        {
            knobs.NUDGE: "The:0",
            knobs.MM_UUID_REWRITE: "stray-uuid",
            knobs.NO_OWNER_WATCH: "1",
            knobs.ENABLE: "1",
            "OPSCTL_PROBES": "batch,mm_uuid",  # probes on, so a knob would have effect
        }
    )
    port = free_port()
    args = (
        "tiny-llama",
        "--load-format",
        "dummy",
        "--eager",
        "--port",
        str(port),
        "--api-key",
        key,
    )
    with served(*args, env=env) as proc:
        ready = read_event(proc)
        url = ready["url"]
        assert ready["event"] == "ready" and url == f"http://127.0.0.1:{port}"
        assert {"APIServer", "EngineCore", "Worker"} <= set(role_pids(ready))
        assert httpx.get(f"{url}/health").status_code == 200  # open, as in vLLM
        assert httpx.get(f"{url}/v1/models").status_code == 401
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/v1/models", headers=auth).status_code == 200

        # the plugin ran in every vLLM process and recorded what it did
        records = read_records(Path(ready["run_dir"]))
        roles = {r["role"]: r for r in records}
        assert {"api_server", "engine_core", "worker"} <= set(roles)
        assert roles["engine_core"]["pid"] == role_pids(ready)["EngineCore"]
        fill = {p["name"]: p for p in roles["worker"]["patches"]}["dummy_constant_fill"]
        assert fill["status"] == "already upstream"  # vLLM 0.32 ships PR 56682
        info = read_events(Path(ready["run_dir"]), "engine_info")
        assert len(info[-1]["kv_cache_groups"]) == 1

        # exported knobs reach no engine process
        assert all(r["test_knobs"] == {} for r in records), [r["test_knobs"] for r in records]
        for role, pid in role_pids(ready).items():
            if role not in ("APIServer", "EngineCore", "Worker"):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            names = {e.split(b"=", 1)[0].decode() for e in environ if e}
            assert not names & {*knobs.KNOBS, knobs.ENABLE}, (role, names & set(knobs.KNOBS))
        inits = [e for e in read_events(Path(ready["run_dir"]), "batch") if e["event"] == "init"]
        assert inits and all(e["nudge"] is None for e in inits)

        # the shm_broadcast ring buffers exist while the engine runs, and are its own
        wait_until(lambda: any(n.startswith("psm_") for n in proc.shm.names()), 30, "psm_")

        clean = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        st = subprocess.run(
            [*OPSCTL, "status", url, "--json", "--api-key", key],
            capture_output=True,
            text=True,
            env=clean,
        )
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        assert doc["healthy"] is True and doc["models"] == ["tiny-llama"]
        assert doc["metrics"]["requests_running"] == 0 and doc["metrics"]["series"] > 20
        st = subprocess.run(
            [*OPSCTL, "status", url, "--json"], capture_output=True, text=True, env=clean
        )
        assert st.returncode == 3, st.stderr
        assert "authentication required" in st.stderr
        assert json.loads(st.stdout)["state"] == "unauthorized"  # --json: the document says why

        led = subprocess.run(
            [*OPSCTL, "patches", "--run", ready["run_dir"], "--json"],
            capture_output=True,
            text=True,
        )
        assert led.returncode == 0 and {p["role"] for p in json.loads(led.stdout)["processes"]} >= {
            "worker"
        }

        stop_and_check(proc, ready, signal.SIGTERM)


def test_serve_real_weights_default_mode_varied_greedy_output_and_ctrl_c():
    """Without --eager, serve runs vLLM's default execution mode (on CPU: torch.compile
    with Dynamo, no --enforce-eager), as operators run it."""
    port = free_port()
    with served("tiny-llama", "--port", str(port)) as proc:
        ready = read_event(proc)
        assert ready["eager"] is False and ready["single_process"] is False
        argv = json.loads((Path(ready["run_dir"]) / "meta.json").read_text())["argv"]
        assert "--enforce-eager" not in argv, argv
        info = read_events(Path(ready["run_dir"]), "engine_info")[-1]
        assert info["enforce_eager"] is False, info
        assert info["compilation_mode"] and "NONE" not in info["compilation_mode"], info
        # vLLM's AOT compile cache: saved by a first start of this config, loaded by the
        # next (aot_cache_load); never the failed load vLLM 0.32 logs on CPU without it
        log = (Path(ready["run_dir"]) / "server.log").read_text()
        assert "Compiling model again due to a load failure" not in log
        assert "saved AOT compiled function" in log or "Directly load AOT compilation" in log

        def greedy(**extra):
            body = {
                "model": "tiny-llama",
                "prompt": "The quick brown fox",
                "max_tokens": 24,
                "temperature": 0,
                "ignore_eos": True,
                **extra,
            }
            r = httpx.post(f"{ready['url']}/v1/completions", timeout=60, json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        choice = greedy(logprobs=1)
        tokens = choice["logprobs"]["tokens"]
        assert len(tokens) == 24
        assert len(set(tokens)) >= 6, f"near-constant greedy output: {tokens}"
        # greedy is deterministic: the same request gives the same text
        again = greedy()["text"]
        assert again == choice["text"]
        stop_and_check(proc, ready, signal.SIGINT)


def test_tiny_hybrid_groups_and_cleanup_after_a_crash():
    """tiny-hybrid gets > 1 KV cache group; then the API server, the Worker and vLLM's
    resource tracker are SIGKILLed, the EngineCore lives on (a crash). The Worker created
    the worker_response_mq ring buffer and only its creator unlinks one, so nobody else
    will; stop() still leaves no process and no orphaned segment. (With the Worker alive,
    the SIGTERM stop() sends lets vLLM unlink both buffers itself: seen in CI.)"""
    # vLLM's multiprocess layout: this test kills the Worker process
    with running_engine("tiny-hybrid", load_format="dummy", single_process=False) as server:
        info = read_events(server.run_dir, "engine_info")[-1]
        groups = info["kv_cache_groups"]
        assert len(groups) > 1, groups
        assert {g["spec"] for g in groups} >= {"SlidingWindowSpec", "FullAttentionSpec"}
        children = psutil.Process(server.pid).children(recursive=True)
        pids = [server.pid, *[c.pid for c in children]]
        # the ring buffers this engine's processes map (an engine of another test running
        # beside this one may create its own meanwhile)
        ours = {
            os.path.basename(m.path)
            for m in shm.scan_holders(pids).mappings
            if not m.deleted and os.path.basename(m.path).startswith("psm_")
        }
        assert len(ours) >= 2  # rpc_broadcast_mq + worker_response_mq
        roles = {c.pid: classify(c.name(), " ".join(c.cmdline()), False) for c in children}
        assert "Worker" in roles.values() and "EngineCore" in roles.values(), roles
        for p in [
            psutil.Process(server.pid),
            *[c for c in children if roles[c.pid] in ("Worker", "resource tracker")],
        ]:
            p.kill()
    report = server.stop_report
    assert report.leftover_pids == [] and gone(pids)
    # the crash left a ring buffer nobody would unlink; stop() removed it
    assert set(report.shm_removed) & ours, (ours, report)
    assert not ours & shm_names()


# These start a server process that never gets to load a model: no engine lock needed.
NO_LOCK = {**os.environ, "OPSCTL_ENGINE_LOCK": ""}


def test_invalid_vllm_argument_is_bad_input_and_leaves_nothing():
    argv = [*OPSCTL, "serve", "--no-tui", "--port", str(free_port()), "--", "--no-such-flag", "3"]
    proc, watch = run_watched(argv, 300, NO_LOCK)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert len(errors) == 1 and "--no-such-flag" in errors[0]
    assert watch.left() == set()


def test_engine_death_is_explained_with_exit_1():
    # passes argparse, then vLLM refuses the config: max_model_len beyond the model's 512
    proc = subprocess.run(
        [
            *OPSCTL,
            "serve",
            "--no-tui",
            "--port",
            str(free_port()),
            "--",
            "--max-model-len",
            "100000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=NO_LOCK,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert len(errors) == 1 and "max_model_len" in errors[0].replace(
        "max-model-len", "max_model_len"
    ), proc.stderr


def test_timeout_exit_4_and_nothing_left():
    t0 = time.time()
    argv = [*OPSCTL, "serve", "--no-tui", "--json", "--port", str(free_port()), "--timeout", "4"]
    proc, watch = run_watched(argv, 120, NO_LOCK)
    assert proc.returncode == 4, proc.stderr
    assert "did not become healthy within 4 s" in proc.stderr
    # stdout: the serve events (JSON lines), then the opsctl.error/1 document
    stopped, error = json_documents(proc.stdout)
    assert stopped["event"] == "stopped" and stopped["leftover_pids"] == []
    assert error["schema"] == "opsctl.error/1" and error["state"] == "timeout", error
    assert error["exit_code"] == 4
    assert time.time() - t0 < 60
    assert watch.left() == set(), watch.left()  # what its engine held is gone
