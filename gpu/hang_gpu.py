"""The GPU signature of a stall (issue 35 item 5), on the H200: one tiny-llama engine in
vLLM's default execution mode (CUDA graphs, async scheduling) armed with both hang knobs,
then two planted hangs, each with one client request held by it:

- gpu:  OPSCTL_HANG_GPU  -- the model step launches a spinning kernel (torch.cuda._sleep)
        again and again and waits for it: the GPU reads busy, no step completes;
- host: OPSCTL_HANG_STEP -- the EngineCore's step blocks on a lock: the GPU reads idle.

For each: NVML's utilisation of the engine's GPU sampled while it hangs, `opsctl console
--once --json --no-discover --stall-window 10s URL` (its state, reason, stall_gpu and how
long it took from the hang), `opsctl stacks URL --json` and `--native --json` (the frame
named), /health; then the hang is released and the held request must answer 200 and the
engine read ready again. Baseline first: `console --once` on the idle engine.

Writes OUT (JSON, rewritten after each step) and copies the engine's ledger, events and
the tail of server.log beside it (OUT's folder /hang-run/). Run from a directory outside
the checkout with PYTHONPATH=<checkout>:/tmp/site (gpu/prove.sh hang does):
    python3 gpu/hang_gpu.py --out /tmp/prove/hang/hang.json --budget 400
Exit 0 when every step ran (whatever it found), 1 otherwise. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import httpx

OPSCTL = [sys.executable, "-m", "opsctl"]


def cli(*args: str, timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    try:
        r = subprocess.run([*OPSCTL, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"argv": ["opsctl", *args], "rc": None, "timed_out": True}
    try:
        doc = json.loads(r.stdout) if r.stdout.strip() else None
    except json.JSONDecodeError:
        doc = {"stdout": r.stdout[-4000:]}
    return {
        "argv": ["opsctl", *args],
        "rc": r.returncode,
        "seconds": round(time.monotonic() - t0, 2),
        "doc": doc,
        "stderr": r.stderr[-3000:],
    }


def nvml_util(pids: set[int]) -> list[dict]:
    """Utilisation of every GPU, and which of the engine's pids each one holds."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver (a dry run on a CPU machine)
        return []
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        procs = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
        out.append(
            {
                "index": i,
                "util_gpu": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                "engine_pids": sorted(procs & pids),
                "t": round(time.time(), 3),
            }
        )
    return out


def engine_util(samples: list[dict]) -> int | None:
    mine = [d["util_gpu"] for d in samples if d["engine_pids"]]
    return mine[0] if mine else (samples[0]["util_gpu"] if samples else None)


def sample_until(pids: set[int], want, deadline_s: float) -> list[list[dict]]:
    """NVML samples every 0.5 s until ``want(util)`` holds or the deadline passes."""
    seen = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        s = nvml_util(pids)
        seen.append(s)
        u = engine_util(s)
        if u is not None and want(u):
            break
        time.sleep(0.5)
    return seen


def hang_case(server, trigger: Path, busy: bool, url: str, model: str) -> dict:
    import psutil

    root = psutil.Process(server.pid)
    pids = {root.pid, *(c.pid for c in root.children(recursive=True))}
    case: dict = {"trigger": str(trigger), "gpu_expected": "busy" if busy else "idle"}
    answers: list = []

    def ask() -> None:
        body = {"model": model, "prompt": "hello there", "max_tokens": 4}
        try:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
            answers.append(r.status_code)
        except Exception as exc:  # recorded, judged by the replay
            answers.append(repr(exc))

    trigger.touch()
    t0 = time.monotonic()
    client = threading.Thread(target=ask, daemon=True)
    client.start()
    try:
        case["nvml_while_hung"] = sample_until(
            pids, (lambda u: u >= 50) if busy else (lambda u: False), 20.0 if busy else 4.0
        )
        case["console"] = cli(
            "console",
            "--once",
            "--json",
            "--no-discover",
            "--stall-window",
            "10s",
            "--canary-timeout",
            "5s",
            url,
        )
        case["console_after_hang_s"] = round(time.monotonic() - t0, 2)
        case["stacks"] = cli("stacks", url, "--json")
        case["stacks_native"] = cli("stacks", url, "--native", "--json", timeout=60)
        case["health_while_hung"] = httpx.get(f"{url}/health", timeout=15).status_code
        case["answers_while_hung"] = list(answers)
    finally:
        trigger.unlink(missing_ok=True)
    client.join(180)
    case["answers_after_release"] = list(answers)
    case["released_after_s"] = round(time.monotonic() - t0, 2)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        st = cli("status", url, "--json")
        if st.get("doc") and st["doc"].get("state") == "ready":
            break
        time.sleep(1)
    case["status_after_release"] = st
    case["nvml_after_release"] = nvml_util(pids)
    return case


def run_engine(
    server,
    doc: dict,
    out: Path,
    ready_timeout: float,
    body: Callable[[float], None],
    keep_dir: Path,
    keep: tuple[str, ...],
    before_stop: tuple[Path, ...] = (),
) -> bool:
    """Start ``server``, run ``body(t0)`` on it, stop it; False when anything raised.

    OUT records the engine's ready time, run dir, an error and its traceback, the stop and
    the seconds; ``keep`` (run-dir folders) and server.log's tail are copied to ``keep_dir``.
    ``before_stop``: trigger files removed before the engine is stopped."""
    t0 = time.monotonic()
    try:
        server.start()
        server.wait_healthy(ready_timeout)
        doc["engine_ready_s"] = round(time.monotonic() - t0, 1)
        doc["run_dir"] = str(server.run_dir)
        body(t0)
        return True
    except Exception as exc:
        doc["error"] = repr(exc)
        doc["tb"] = traceback.format_exc()
        return False
    finally:
        for path in before_stop:
            path.unlink(missing_ok=True)
        rep = server.stop()
        doc["stop"] = {"seconds": rep.seconds, "leftover_pids": rep.leftover_pids}
        doc["seconds"] = round(time.monotonic() - t0, 1)
        out.write_text(json.dumps(doc, indent=1))
        if server.run_dir is not None:
            keep_dir.mkdir(exist_ok=True)
            for sub in keep:
                if (server.run_dir / sub).is_dir():
                    shutil.copytree(server.run_dir / sub, keep_dir / sub, dirs_exist_ok=True)
            log = server.run_dir / "server.log"
            if log.is_file():
                (keep_dir / "server.log").write_bytes(log.read_bytes()[-2_000_000:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=400.0)
    a = p.parse_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from engine_patches import knobs
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    doc: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": {}}
    hold = Path(tempfile.mkdtemp(prefix="opsctl-hang-"))
    gpu_t, host_t = hold / "gpu", hold / "host"
    opts = LaunchOptions(
        model=resolve("tiny-llama"),
        load_format="dummy",
        label="gpu-hang",
        enforce_eager=False,  # vLLM's default mode: torch.compile + CUDA graphs
        knobs={knobs.HANG_GPU: str(gpu_t), knobs.HANG_STEP: str(host_t)},
    )
    server = EngineServer(opts)
    failed: list[str] = []

    def cases(t0: float) -> None:
        doc["url"] = server.url
        doc["baseline"] = cli("console", "--once", "--json", "--no-discover", server.url)
        out.write_text(json.dumps(doc, indent=1))
        for name, trigger, busy in (("gpu", gpu_t, True), ("host", host_t, False)):
            if time.monotonic() - t0 > a.budget - 60:
                doc["cases"][name] = {"skipped": "budget"}
                continue
            try:
                doc["cases"][name] = hang_case(server, trigger, busy, server.url, "tiny-llama")
            except Exception as exc:
                failed.append(name)
                doc["cases"][name] = {"error": repr(exc), "tb": traceback.format_exc()}
            out.write_text(json.dumps(doc, indent=1))

    ran = run_engine(
        server,
        doc,
        out,
        min(300.0, a.budget - 120),
        cases,
        out.parent / "hang-run",
        ("ledger", "events", "stacks"),
        before_stop=(gpu_t, host_t),
    )
    ok = ran and not failed
    if server.run_dir is not None:
        shutil.rmtree(hold, ignore_errors=True)
    print(json.dumps({k: v for k, v in doc.items() if k != "cases"}, default=str)[:1500])
    for name, c in doc["cases"].items():
        con = (c.get("console") or {}).get("doc") or {}
        e = (con.get("endpoints") or [{}])[0]
        print(
            name,
            "console rc",
            (c.get("console") or {}).get("rc"),
            e.get("state"),
            e.get("stall_gpu"),
            "after",
            c.get("console_after_hang_s"),
            "s;",
            "answers",
            c.get("answers_after_release"),
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
