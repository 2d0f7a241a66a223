"""Soak `opsctl serve`: N start/request/stop cycles, leaks and stop times.

Each cycle starts `opsctl serve --no-tui --json` (embedded tiny-llama, dummy weights by
default), waits for its "ready" event, sends one completion, stops it with SIGTERM and
then counts what it left behind: engine processes still alive (psutil, by pid and start
time) and /dev/shm entries that appeared during the cycle and remain. Prints one line per
cycle and the stop-time distribution (opsctl's own stop report and the wall time from
SIGTERM to exit).

    python benchmarks/soak_serve.py [--cycles 20] [--load-format dummy|auto]

Not part of the test suite (20 cycles take ~10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.opsctl_run import read_event

SHM = Path("/dev/shm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(procs: list[psutil.Process]) -> list[int]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def cycle(i: int, load_format: str) -> dict:
    before = {p.name for p in SHM.iterdir()}
    t_start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opsctl",
            "serve",
            "--no-tui",
            "--json",
            "--load-format",
            load_format,
            "--port",
            str(free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = read_event(proc, 400)
        ready_s = time.monotonic() - t_start
        root = psutil.Process(ready["pid"])
        tree = [root, *root.children(recursive=True)]
        body = {"model": ready["model"], "prompt": "Hello", "max_tokens": 8}
        r = httpx.post(f"{ready['url']}/v1/completions", json=body, timeout=60)
        t_sig = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        wall_stop = time.monotonic() - t_sig
        stopped = read_event(proc, 5)
    finally:
        if proc.poll() is None:
            proc.kill()
    leaked = alive(tree)
    new_shm = sorted({p.name for p in SHM.iterdir()} - before)
    row = {
        "cycle": i,
        "rc": rc,
        "request": r.status_code,
        "ready_s": round(ready_s, 1),
        "stop_s": stopped.get("duration_s"),
        "wall_stop_s": round(wall_stop, 2),
        "leaked_pids": leaked,
        "new_shm": new_shm,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--load-format", default="dummy", choices=("dummy", "auto"))
    args = ap.parse_args()
    os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")
    rows = [cycle(i, args.load_format) for i in range(1, args.cycles + 1)]
    stops = [r["stop_s"] for r in rows if r["stop_s"] is not None]
    walls = [r["wall_stop_s"] for r in rows]
    leaks = sum(len(r["leaked_pids"]) for r in rows)
    shm = sum(len(r["new_shm"]) for r in rows)
    bad = [r["cycle"] for r in rows if r["rc"] != 0 or r["request"] != 200]
    print(f"cycles {len(rows)}; failed cycles {bad or 'none'}")
    print(f"leaked processes {leaks}; leftover /dev/shm entries {shm}")
    for name, xs in (("stop (opsctl report)", stops), ("SIGTERM -> exit (wall)", walls)):
        print(
            f"{name}: min {min(xs):.2f} s  median {statistics.median(xs):.2f} s  "
            f"max {max(xs):.2f} s"
        )
    print(f"time to ready: median {statistics.median(r['ready_s'] for r in rows):.1f} s")
    return 1 if bad or leaks or shm else 0


if __name__ == "__main__":
    sys.exit(main())
