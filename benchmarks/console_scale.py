"""How the console scales with direct scraping, and how it compares with vllmstat.

Part 1 (stand-ins): N = 8, 64, 256 endpoints serving the recorded real vLLM /metrics body
(tests/data/), one of them hung (accepts, never answers). Each row runs the real console
app headless at the default 1 s interval in a child process for DURATION seconds and
reports: console CPU (% of one core, all threads), per-endpoint poll time p95, poll
period p95 (time between two polls of one endpoint), and data age p95/max of the healthy
endpoints. Bodies are "busy" (they change every poll, so every body is parsed) unless
the row says idle.

Part 3 (Prometheus, with --prometheus 256,1024): N stand-in targets (one hung) scraped by
a real Prometheus (Debian's package, scrape interval 5 s, /metrics and /health jobs) and
the console reading them through Prometheus's API (`--prometheus URL --job vllm`), against
the console scraping the same N directly at 1 s and at 5 s (the freshness Prometheus
gives). Columns: console CPU (% of one core), refresh latency p95 (direct: one endpoint's
poll; Prometheus: one poll of the whole fleet: targets, figures and stall samples, three
requests plus parsing), the percentiles query p95 (Prometheus: seven histogram_quantile
unions every 15 s, apart from the poll), row period p95, data age p95 / max (Prometheus:
the data's own scrape time), and Prometheus's own CPU while the console reads it.

Part 0 (rendering alone, with --render 8,64,256): the fleet table (FleetTable, the
console's own widget) in a headless Textual app at 200x60, fed the same N rows every
tick with 4 figures of each row changing (running, KV %, gen tok/s, prompt tok/s) and
one tick in ten with nothing changed; the CPU of each tick, drawing included, on this
process's CPU clock (other processes' load does not count, unlike the rows above), and
the lines the table painted per tick (its render_line calls).

Part 2 (real server, with --real): benchmarks/vs_vllmstat.py's side_by_side: one bare
tiny-llama vLLM server, the `opsctl console` TUI and vllmstat's TUI at once, each in its
own tmux pane, a 10 s warm-up then DURATION seconds: CPU % of a core, RSS, requests to
the server, load average. vllmstat in its own venv (VLLMSTAT=/path/to/vllmstat, e.g.
`python -m venv /tmp/vstat && /tmp/vstat/bin/pip install vllmstat`).

    python benchmarks/console_scale.py [--duration 30] [--sizes 8,64,256] [--real]
        [--prometheus 256,1024] [--no-direct-sizes] [--no-ui] [--profile [DIR]]

With --profile, each console child runs under cProfile (its main thread, where the
Textual app renders, and the scrape loop's thread, both over the measured window) and
writes DIR/console_N<n>_<how>.txt: the top functions by cumulative and by own time,
with the share of the profiled CPU each one took (thread CPU time, so waiting and other
processes' load are not counted). cProfile slows the console down (all
Python calls are traced): read the shares, not the CPU % of a profiled run. --no-ui runs
the direct rows with the source alone (no Textual app): the collection's own cost.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
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


def make_source(urls: list[str], interval: float, prom_url: str | None):
    from opsctl.console import targets
    from opsctl.console.direct import DirectScrapeSource
    from opsctl.console.judge_state import Settings
    from opsctl.console.prometheus import PrometheusSource

    settings = Settings(interval_s=interval)
    if prom_url:
        return PrometheusSource(prom_url, job="vllm", settings=settings)
    return DirectScrapeSource(targets.from_urls(urls), discover=False, settings=settings)


class Sampler:
    """What a console shows, read every half interval: data ages, poll times, periods."""

    def __init__(self, src, hung: str, prom: bool) -> None:
        self.src, self.hung, self.prom = src, hung, prom
        self.ages: list[float] = []
        self.polls: list[float] = []
        self.periods: list[float] = []
        self.latency: list[float] = []
        self.last_seen: dict[str, float] = {}
        self.seen_poll: int | None = None
        self.seen_latency: float | None = None

    def sample(self) -> None:
        now = time.time()
        for v in self.src.collect().endpoints:
            if v.target.url == self.hung or v.last_ok_at is None:
                continue
            self.ages.append(now - v.last_ok_at)
            if v.poll_s is not None and not self.prom:
                self.polls.append(v.poll_s)
            prev = self.last_seen.get(v.target.url)
            if v.last_scrape_at and prev and v.last_scrape_at != prev:
                self.periods.append(v.last_scrape_at - prev)
            if v.last_scrape_at:
                self.last_seen[v.target.url] = v.last_scrape_at
        src = self.src
        if self.prom and src.poll_s is not None and src.polls != self.seen_poll:
            self.seen_poll = src.polls
            self.polls.append(src.poll_s)
        if self.prom and src.latency_s is not None and src.latency_started != self.seen_latency:
            self.seen_latency = src.latency_started
            self.latency.append(src.latency_s)

    def result(self) -> dict:
        views = self.src.collect().endpoints
        states: dict[str, int] = {}
        for v in views:
            states[v.state] = states.get(v.state, 0) + 1
        return {
            "hung_state": next((v.state for v in views if v.target.url == self.hung), "missing"),
            "rows": len(views),
            "states": states,
            "latency_query_p95_s": p95(self.latency),
            "poll_p95_ms": 1000 * (p95(self.polls) or 0),
            "period_p95_s": p95(self.periods),
            "age_p95_s": p95(self.ages),
            "age_max_s": max(self.ages) if self.ages else None,
        }


class Profiler:
    """cProfile over the console's two busy threads: the caller's (the app) and the
    source's event-loop thread (one Profile each, merged into one top list)."""

    def __init__(self, src, path: str | None) -> None:
        self.src, self.path = src, path
        # the thread's CPU clock, not the wall clock: on a busy host a wall-clock profile
        # charges other processes' time to whatever function was descheduled
        self.main = cProfile.Profile(time.thread_time)
        self.loop = cProfile.Profile(time.thread_time)

    def _in_loop(self, fn) -> None:
        import concurrent.futures

        done: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            fn()
            done.set_result(None)

        self.src.loop.call_soon_threadsafe(call)
        done.result(timeout=30)

    def start(self) -> None:
        if self.path:
            self._in_loop(self.loop.enable)
            self.main.enable()

    def stop(self) -> None:
        if not self.path:
            return
        self.main.disable()
        self._in_loop(self.loop.disable)
        out = io.StringIO()
        stats = pstats.Stats(self.main, stream=out)
        stats.add(self.loop)
        total = stats.total_tt or 1e-9
        out.write(f"profiled CPU (both threads, own time summed): {total:.2f} s\n")
        out.write("\nown time shares (top 40):\n")
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:40]
        for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
            where = f"{Path(file).name}:{line}({fn})"
            out.write(f"  {100 * tt / total:5.1f} %  own {tt:7.3f} s  cum {ct:7.3f} s  "
                      f"calls {nc:8d}  {where}\n")  # fmt: skip
        out.write("\nown time by part (a builtin's time goes to its callers' parts):\n")
        for part, secs in sorted(by_part(stats).items(), key=lambda kv: -kv[1]):
            out.write(f"  {100 * secs / total:5.1f} %  {secs:7.3f} s  {part}\n")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        stats.dump_stats(str(Path(self.path).with_suffix(".prof")))
        out.write("\ncumulative (top 60):\n")
        stats.sort_stats("cumulative").print_stats(60)
        Path(self.path).write_text(out.getvalue())


PARTS = (  # (part, path fragments), first match wins
    ("parsing /metrics", ("opsctl/domain/metrics", "prometheus_client/")),
    ("figures, histogram maths", ("opsctl/console/judge.py", "opsctl/console/judge_advisor")),
    ("rendering (Textual, Rich, opsctl.ui)",
     ("textual/", "rich/", "opsctl/ui/", "opsctl/console/view_")),
    ("state tracking", ("opsctl/console/judge_state", "opsctl/console/")),
    ("HTTP client (httpx, httpcore, h11, anyio)", ("httpx/", "httpcore/", "h11/", "anyio/",
                                                   "sniffio/", "ssl.py", "socket.py")),
    ("event loop (asyncio, selectors)", ("asyncio/", "selectors.py", "threading.py")),
)  # fmt: skip


def _part(file: str) -> str:
    for part, frags in PARTS:
        if any(f in file for f in frags):
            return part
    return "other"


def by_part(stats: pstats.Stats) -> dict[str, float]:
    """Own CPU per part of the console; a builtin (file "~") is charged to its callers'
    parts in proportion to the time it spent under each caller."""
    parts: dict[str, float] = {}
    for (file, _line, _fn), (_cc, _nc, tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if file != "~" or not callers:
            part = _part(file)
            parts[part] = parts.get(part, 0.0) + tt
            continue
        under = {k: v[2] for k, v in callers.items()}
        whole = sum(under.values()) or 1.0
        for (cfile, _l, _f), t in under.items():
            part = _part(cfile)
            parts[part] = parts.get(part, 0.0) + tt * t / whole
    return parts


def child(
    urls: list[str],
    duration: float,
    interval: float,
    prom_url: str | None = None,
    ui: bool = True,
    profile: str | None = None,
) -> dict:
    """The console (the app headless, or with ``ui`` False its source alone) measuring
    itself over ``duration`` after a warm-up (first polls; a Prometheus period is 5 s)."""
    import asyncio

    from opsctl.console.view_app import build_console_app

    src = make_source(urls, interval, prom_url)
    sampler = Sampler(src, urls[-1], bool(prom_url))
    prof = Profiler(src, profile)
    warm = 3 * max(interval, 5.0 if prom_url else 0.0) + 2
    out: dict = {}

    async def run_app() -> None:
        app = build_console_app(src, interval=interval)
        async with app.run_test(headless=True, size=(200, 60)) as pilot:
            await pilot.pause(warm)
            prof.start()
            t0, c0 = time.monotonic(), time.process_time()
            while time.monotonic() - t0 < duration:
                await pilot.pause(interval / 2)
                sampler.sample()
            out["cpu_pct"] = 100 * (time.process_time() - c0) / (time.monotonic() - t0)
            prof.stop()
            out["renders"] = app.table.renders

    src.start()
    try:
        if ui:
            asyncio.run(run_app())
        else:
            time.sleep(warm)
            prof.start()
            t0, c0 = time.monotonic(), time.process_time()
            while time.monotonic() - t0 < duration:
                time.sleep(interval / 2)
                sampler.sample()
            out["cpu_pct"] = 100 * (time.process_time() - c0) / (time.monotonic() - t0)
            prof.stop()
        out.update(sampler.result())
    finally:
        src.close()
    return out


# ---- part 0: the fleet table's rendering alone -----------------------------------------------


def render_row(n: int, ticks: int = 40) -> dict:
    """CPU per tick of FleetTable.show + Textual drawing it, N rows, 4 cells changing."""
    import asyncio
    from dataclasses import replace

    from textual.app import App

    from opsctl.console import judge as c
    from opsctl.console.judge_state import EndpointTracker, Settings
    from opsctl.console.view_fleet_table import FleetTable

    base = []
    for i in range(n):
        # loopback URLs, never asked (the table only draws them)
        target = c.Target(f"node-{i:04d}", f"http://127.0.0.1:{20000 + i}", "targets")
        base.append(EndpointTracker(target, Settings(interval_s=1.0)).view)

    def views(t: int) -> list:
        out = []
        for i, v in enumerate(base):
            k = (t + i) % 9  # 3 digits that move, widths steady (as real figures mostly are)
            f = replace(v.figures, running=float(k), kv_usage=0.1 + k / 100,
                        generation_tps=200.0 + k / 10, prompt_tps=100.0 + k / 10)  # fmt: skip
            out.append(replace(v, state="busy", figures=f))
        return out

    class TableApp(App):
        def compose(self):
            yield FleetTable()

    out: dict = {"n": n}

    async def run() -> None:
        app = TableApp()
        async with app.run_test(headless=True, size=(200, 60)) as pilot:
            table = app.query_one(FleetTable)
            for t in range(3):  # warm-up: rows added, widths measured
                table.show(views(t), 1000.0, 1.0)
                await pilot.pause(0.05)
            busy, idle, lines = [], [], {True: 0, False: 0}
            for t in range(3, 3 + ticks):
                same = t % 10 == 0
                c0, painted = time.thread_time(), table.painted
                table.show(views(t - 1 if same else t), 1000.0, 1.0)
                await pilot.pause(0.05)  # drawn (Textual renders on its own timer)
                (idle if same else busy).append(1000 * (time.thread_time() - c0))
                lines[same] += table.painted - painted
            out["ms_per_changing_tick"] = sum(busy) / len(busy)
            out["ms_per_unchanged_tick"] = sum(idle) / len(idle)
            out["lines_per_changing_tick"] = lines[False] / len(busy)  # rows repainted
            out["lines_per_unchanged_tick"] = lines[True] / len(idle)

    asyncio.run(run())
    return out


def part0(sizes: list[int]) -> list[dict]:
    rows = [render_row(n) for n in sizes]
    print(
        "\n| N rows | CPU per tick, 4 cells of every row changed | lines painted |"
        " CPU per tick, nothing changed | lines painted |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {r['ms_per_changing_tick']:.1f} ms | {r['lines_per_changing_tick']:.0f} |"
            f" {r['ms_per_unchanged_tick']:.1f} ms | {r['lines_per_unchanged_tick']:.0f} |"
        )
    print(json.dumps(rows))
    return rows


# ---- part 1 -----------------------------------------------------------------------------------


def standins(modes: list[str]) -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.standins.vllm_server", *modes],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


PROFILE_DIR: str | None = None  # --profile: where the children write their top lists
UI = True  # --no-ui: part 1 measures the source alone


def run_child(
    urls: list[str],
    duration: float,
    interval: float = 1.0,
    prom: str = "",
    ui: bool = True,
    label: str = "",
) -> dict:
    args = ["--duration", str(duration), "--interval", str(interval), "--prom", prom]
    args += [] if ui else ["--no-ui"]
    if PROFILE_DIR:
        name = f"console_N{len(urls)}_{label or 'row'}{'' if ui else '_source'}.txt"
        args += ["--profile-out", str(Path(PROFILE_DIR).resolve() / name)]
    try:
        r = subprocess.run(  # the URLs on stdin: 1024 of them are a long command line
            [sys.executable, __file__, "--child", "-", *args],
            input=json.dumps(urls),
            capture_output=True,
            text=True,
            timeout=duration + 300,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:  # a console that cannot keep up is a result too
        keys = ("cpu_pct", "poll_p95_ms", "latency_query_p95_s", "period_p95_s", "age_p95_s",
                "age_max_s")  # fmt: skip
        return {**dict.fromkeys(keys), "hung_state": f"did not finish in {duration + 300:g} s",
                "rows": None}  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def stop_standins(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(30)


def scale_row(n: int, duration: float, body: str) -> dict:
    proc, urls = standins([body] * (n - 1) + ["hung"])
    try:
        label = "idle" if body == "healthy" else "changing"
        return {"n": n, "body": body, "ui": UI, **run_child(urls, duration, ui=UI, label=label)}
    finally:
        stop_standins(proc)


def part1(sizes: list[int], duration: float) -> list[dict]:
    rows = [scale_row(8, duration, "healthy")]
    rows += [scale_row(n, duration, "busy") for n in sizes]
    how = "app headless" if UI else "source only"
    print(f"\n| N (1 hung) | bodies | console ({how}) CPU % of a core | poll p95 | "
          "poll period p95 | healthy data age p95 / max | hung endpoint |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {'idle' if r['body'] == 'healthy' else 'changing'} | "
            f"{_f(r['cpu_pct'], '.1f')} | {_f(r['poll_p95_ms'], '.0f', ' ms')} | "
            f"{_f(r['period_p95_s'], '.2f', ' s')} | {_f(r['age_p95_s'], '.2f', ' s')} / "
            f"{_f(r['age_max_s'], '.2f', ' s')} | {r['hung_state']} |"
        )
    print(json.dumps(rows))
    return rows


# ---- part 3: through Prometheus ------------------------------------------------------------

PROM_SCRAPE_S = 5.0


def prom_rows(n: int, duration: float) -> list[dict]:
    """Direct at 1 s and 5 s, then through a real Prometheus, over the same N stand-ins
    (Prometheus runs only in its own row, so it takes no CPU from the direct rows)."""
    import psutil

    from tests.prometheus_fixture import running_prometheus

    proc, urls = standins(["busy"] * (n - 1) + ["hung"])
    rows = []
    try:
        for interval in (1.0, PROM_SCRAPE_S):
            how = f"direct, {interval:g} s"
            label = f"direct{interval:g}s"
            rows.append({"n": n, "how": how, **run_child(urls, duration, interval, label=label)})
            print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
        with running_prometheus(urls, interval=PROM_SCRAPE_S, timeout=300) as server:
            p = psutil.Process(server.proc.pid)

            def cpu() -> float:
                return sum(p.cpu_times()[:2])

            c0, t0 = cpu(), time.monotonic()
            time.sleep(min(duration, 30.0))  # Prometheus alone: scraping, nobody reading
            alone = 100 * (cpu() - c0) / (time.monotonic() - t0)
            for ui in (False, True):
                c0, t0 = cpu(), time.monotonic()
                r = run_child(urls, duration, 1.0, server.url, ui, label="prometheus")
                r["prom_cpu_pct"] = 100 * (cpu() - c0) / (time.monotonic() - t0)
                r["prom_alone_cpu_pct"] = alone
                how = f"Prometheus, scrape {PROM_SCRAPE_S:g} s" + ("" if ui else ", source only")
                rows.append({"n": n, "how": how, **r})
                print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        stop_standins(proc)
    return rows


def _f(v: float | None, spec: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def part3(sizes: list[int], duration: float) -> list[dict]:
    rows = [r for n in sizes for r in prom_rows(n, duration)]
    print("\n| N (1 hung) | console reads | console CPU % of a core | refresh p95 | "
          "percentiles query p95 | row period p95 | data age p95 / max | states | "
          "Prometheus CPU % (alone / while read) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        states = ", ".join(f"{k} {v}" for k, v in sorted((r.get("states") or {}).items()))
        prom = "-"
        if r.get("prom_cpu_pct") is not None:
            prom = f"{r['prom_alone_cpu_pct']:.0f} / {r['prom_cpu_pct']:.0f}"
        print(
            f"| {r['n']} | {r['how']} | {_f(r['cpu_pct'], '.1f')} | "
            f"{_f(r['poll_p95_ms'], '.0f', ' ms')} | {_f(r['latency_query_p95_s'], '.1f', ' s')} | "
            f"{_f(r['period_p95_s'], '.1f', ' s')} | {_f(r['age_p95_s'], '.1f', ' s')} / "
            f"{_f(r['age_max_s'], '.1f', ' s')} | {states or r['hung_state']} | {prom} |"
        )
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--sizes", default="8,64,256")
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--render", default="", help="sizes for part 0 (rendering alone), e.g. 64")
    ap.add_argument("--prometheus", default="", help="sizes for part 3, e.g. 256,1024")
    ap.add_argument("--no-direct-sizes", action="store_true", help="skip part 1")
    ap.add_argument("--child")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--prom", default="")
    ap.add_argument("--no-ui", action="store_true", help="part 1: the source alone, no app")
    ap.add_argument(
        "--profile",
        nargs="?",
        const="console_profiles",
        default=None,
        metavar="DIR",
        help="cProfile every console child; top lists to DIR (default ./console_profiles)",
    )
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        urls = json.loads(sys.stdin.read() if args.child == "-" else args.child)
        result = child(
            urls, args.duration, args.interval, args.prom or None, not args.no_ui, args.profile_out
        )
        print(json.dumps(result))
        raise SystemExit(0)
    os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
    PROFILE_DIR = args.profile
    UI = not args.no_ui
    if args.render:
        part0([int(x) for x in args.render.split(",")])
    if not args.no_direct_sizes:
        part1([int(x) for x in args.sizes.split(",")], args.duration)
    if args.prometheus:
        part3([int(x) for x in args.prometheus.split(",")], args.duration)
    if args.real:
        from benchmarks.vs_vllmstat import side_by_side as part2

        raise SystemExit(part2(args.duration))
