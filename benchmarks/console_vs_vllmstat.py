"""Part 2 of console_scale.py: `opsctl console` vs vllmstat on one real, idle bare
tiny-llama vLLM server (see console_scale.py's docstring).

    VLLMSTAT=/tmp/vs-venv/bin/vllmstat python benchmarks/console_vs_vllmstat.py [--duration 60]
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")

OPSCTL = [sys.executable, "-m", "opsctl"]


def vllmstat() -> str:
    exe = os.environ.get("VLLMSTAT") or shutil.which("vllmstat") or "/tmp/vs-venv/bin/vllmstat"
    if not Path(exe).exists():
        raise SystemExit("vllmstat not found: pip install '.[bench]' or set VLLMSTAT=")
    return exe


def tree_cpu(p: psutil.Process) -> float:
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = q.cpu_times()
            total += t.user + t.system
    return total


def tui_cpu(argv: list[str], duration: float, warmup: float = 5.0) -> float:
    """CPU % of one core of a TUI running in a pseudo-terminal (120x40), after a warm-up."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.environ.update({"TERM": "xterm-256color", "COLUMNS": "160", "LINES": "48"})
        os.execvp(argv[0], argv)
    proc = psutil.Process(pid)

    def drain(until: float) -> None:
        while time.monotonic() < until:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                with contextlib.suppress(OSError):
                    os.read(fd, 65536)

    try:
        drain(time.monotonic() + warmup)
        c0, t0 = tree_cpu(proc), time.monotonic()
        drain(t0 + duration)
        return 100 * (tree_cpu(proc) - c0) / (time.monotonic() - t0)
    finally:
        for q in [*proc.children(recursive=True), proc]:
            with contextlib.suppress(psutil.Error):
                q.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(fd)


def once_cpu(argv: list[str]) -> tuple[dict, float]:
    """(JSON document, CPU seconds of the whole process)."""
    before = os.times()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return json.loads(r.stdout), cpu


def part2(duration: float) -> None:
    from opsctl.engine.model import resolve
    from tests.bare_vllm import bare_vllm

    vs = vllmstat()
    with bare_vllm(str(resolve("tiny-llama").path)) as server:
        url = server.url
        ours_doc, ours_cpu = once_cpu(
            [*OPSCTL, "console", "--once", "--json", "--no-discover", url]
        )
        vs_doc, vs_cpu = once_cpu([vs, "--once", "--json", "--no-gpu", "-u", url])
        ours_tui = tui_cpu([*OPSCTL, "console", "--no-discover", url], duration)
        vs_tui = tui_cpu([vs, "--no-gpu", "-u", url, "-i", "1"], duration)
    e = ours_doc["endpoints"][0]
    snap = vs_doc.get("items", [[None, vs_doc]])[0][1] if "items" in vs_doc else vs_doc
    print("\n| figure | opsctl console --once --json | vllmstat --once --json |")
    print("|---|---|---|")
    print(f"| requests running | {e['requests_running']} | {snap.get('running')} |")
    print(f"| requests waiting | {e['requests_waiting']} | {snap.get('waiting')} |")
    print(f"| KV usage | {e['kv_cache_usage']} | {snap.get('kv_usage')} |")
    kv = snap.get("kv") or {}
    print(f"| KV capacity tokens | {e['kv_capacity_tokens']} | {kv.get('capacity_tokens')} |")
    print(f"| process CPU for one --once | {ours_cpu:.2f} s | {vs_cpu:.2f} s |")
    print(f"\n| TUI on 1 idle server, 1 Hz, {duration:.0f} s | CPU % of a core | CPU per poll |")
    print("|---|---|---|")
    print(f"| opsctl console | {ours_tui:.2f} | {ours_tui * 10:.1f} ms |")
    print(f"| vllmstat | {vs_tui:.2f} | {vs_tui * 10:.1f} ms |")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60.0)
    part2(ap.parse_args().duration)
