"""How the console scales with direct scraping, and how it compares with vllmstat.

Part 1 (stand-ins): N = 8, 64, 256 endpoints serving the recorded real vLLM /metrics body
(tests/data/), one of them hung (accepts, never answers). Each row runs the real console
app headless at the default 1 s interval in a child process for DURATION seconds and
reports: console CPU (% of one core, all threads), per-endpoint poll time p95, poll
period p95 (time between two polls of one endpoint), and data age p95/max of the healthy
endpoints. Bodies are "busy" (they change every poll, so every body is parsed) unless
the row says idle.

Part 2 (real server, with --real): one bare tiny-llama vLLM server; the `opsctl console`
TUI and vllmstat's TUI each watch it at 1 Hz in a pseudo-terminal for DURATION seconds
(CPU % of one core, CPU per poll), and both tools' `--once --json` figures side by side.
vllmstat comes from the `bench` extra; set VLLMSTAT=/path/to/vllmstat (a separate venv
is fine: `python -m venv /tmp/vs-venv && /tmp/vs-venv/bin/pip install vllmstat`).

    python benchmarks/console_scale.py [--duration 30] [--sizes 8,64,256] [--real]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


# ---- child: the console app, headless, measuring itself ---------------------------------------


def child(urls: list[str], duration: float, interval: float) -> dict:
    import asyncio

    from opsctl.console import targets
    from opsctl.console.direct import DirectScrapeSource
    from opsctl.domain.console_state import Settings
    from opsctl.ui.console_app import build_console_app

    src = DirectScrapeSource(
        targets.from_urls(urls), discover=False, settings=Settings(interval_s=interval)
    )
    hung = urls[-1]
    ages: list[float] = []
    polls: list[float] = []
    periods: list[float] = []
    last_seen: dict[str, float] = {}
    out: dict = {}

    async def run() -> None:
        src.start()
        app = build_console_app(src, interval=interval)
        async with app.run_test(headless=True, size=(200, 60)) as pilot:
            await pilot.pause(3 * interval + 2)  # warm-up: first polls, info fetches
            t0, c0 = time.monotonic(), time.process_time()
            while time.monotonic() - t0 < duration:
                await pilot.pause(interval / 2)
                now = time.time()
                for v in src.collect().endpoints:
                    if v.target.url == hung or v.last_ok_at is None:
                        continue
                    ages.append(now - v.last_ok_at)
                    if v.poll_s is not None:
                        polls.append(v.poll_s)
                    prev = last_seen.get(v.target.url)
                    if v.last_scrape_at and prev and v.last_scrape_at != prev:
                        periods.append(v.last_scrape_at - prev)
                    if v.last_scrape_at:
                        last_seen[v.target.url] = v.last_scrape_at
            out["cpu_pct"] = 100 * (time.process_time() - c0) / (time.monotonic() - t0)
            out["renders"] = app.table.renders
            out["hung_state"] = src.tracker(hung).view.state
        src.close()

    asyncio.run(run())
    out.update(
        poll_p95_ms=1000 * (p95(polls) or 0),
        period_p95_s=p95(periods),
        age_p95_s=p95(ages),
        age_max_s=max(ages) if ages else None,
    )
    return out


# ---- part 1 -----------------------------------------------------------------------------------


def standins(modes: list[str]) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standin_vllm", *modes],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def scale_row(n: int, duration: float, body: str) -> dict:
    proc, urls = standins([body] * (n - 1) + ["hung"])
    try:
        r = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(urls), "--duration", str(duration)],
            capture_output=True,
            text=True,
            timeout=duration + 120,
            cwd=REPO,
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return {"n": n, "body": body, **json.loads(r.stdout.strip().splitlines()[-1])}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def part1(sizes: list[int], duration: float) -> list[dict]:
    rows = [scale_row(8, duration, "healthy")]
    rows += [scale_row(n, duration, "busy") for n in sizes]
    print("\n| N (1 hung) | bodies | console CPU % of a core | poll p95 | poll period p95 | "
          "healthy data age p95 / max | hung endpoint |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {'idle' if r['body'] == 'healthy' else 'changing'} | "
            f"{r['cpu_pct']:.1f} | {r['poll_p95_ms']:.0f} ms | {r['period_p95_s']:.2f} s | "
            f"{r['age_p95_s']:.2f} s / {r['age_max_s']:.2f} s | {r['hung_state']} |"
        )
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--sizes", default="8,64,256")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.duration, 1.0)))
        raise SystemExit(0)
    os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
    part1([int(x) for x in args.sizes.split(",")], args.duration)
    if args.real:
        from benchmarks.console_vs_vllmstat import part2

        part2(args.duration)
