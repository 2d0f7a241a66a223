"""CPU per poll of one endpoint (/health + /metrics, parsing included), by HTTP client.

Stand-in endpoints (tests/standins/vllm_server.py) run in a child process, so this process's CPU
clock counts the console's side only. For each client (httpx: ``Poller(fast=False)``;
fast: opsctl.collectors.fastget) and each body kind (busy: a changed body every poll;
healthy: the same body), N endpoints are polled together, ROUNDS times, each endpoint by
one Poller kept across rounds (as the console does); the figure is this process's CPU
(user + system) per poll, in microseconds. With --parse-only, also the parse alone.

    python benchmarks/scrape_poll.py [--endpoints 8] [--rounds 50] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def _rounds(urls: list[str], fast: bool, rounds: int, prof: cProfile.Profile | None):
    from opsctl.collectors.scrape import MetricsCache, Poller

    pollers = [Poller(u, None, 5.0, fast=fast) for u in urls]
    caches = [MetricsCache() for _ in urls]

    async def one_round() -> None:
        scrapes = await asyncio.gather(
            *(p.scrape(cache=c) for p, c in zip(pollers, caches, strict=True))
        )
        for s in scrapes:
            assert s.health.status == 200 and s.samples is not None, s

    await one_round()  # connect, first parse
    if prof is not None:
        prof.enable()
    t0 = time.process_time()
    for _ in range(rounds):
        await one_round()
    cpu = time.process_time() - t0
    if prof is not None:
        prof.disable()
    connects = sum(p.fast.connects for p in pollers if p.fast is not None)
    for p in pollers:
        await p.aclose()
    return cpu, connects


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for mode in ("busy", "healthy"):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.standins.vllm_server", *[mode] * args.endpoints],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            urls = json.loads(child.stdout.readline())
            for fast in (False, True):
                prof = cProfile.Profile(time.process_time) if args.profile else None
                cpu, connects = asyncio.run(_rounds(urls, fast, args.rounds, prof))
                polls = args.rounds * len(urls)
                row = {
                    "bodies": mode,
                    "client": "fast" if fast else "httpx",
                    "cpu_per_poll_us": round(1e6 * cpu / polls),
                    "polls": polls,
                    "connects": connects if fast else None,
                }
                print(json.dumps(row), flush=True)
                if prof is not None:
                    pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        finally:
            child.stdin.close()
            child.wait(10)


if __name__ == "__main__":
    main()
