"""Ranks (issue 44 item 7): how fast each planted multi-rank case is named, whether an idle
DP=2 server ever reads unhealthy, and what the console costs on DP=2 against one engine.

Two real engines on CPU (tiny-llama, dummy weights), one after the other, each judged by the
real CLI in child processes (`opsctl console --once --json`, `opsctl status --json`,
`opsctl stacks --json`):

  TP=2 (Worker_TP0, Worker_TP1; the rank-hang knob armed), under 8 closed-loop clients:
    tp-stop   Worker_TP1 SIGSTOPped: seconds to `console --once` stalled, and to `stacks`
              stuck naming Worker_TP1 (Worker_TP0 waiting in the all-reduce)
    tp-hang   the knob: Worker_TP1 blocked in its forward before the all-reduce (no process
              stopped): the same two
  DP=2 (EngineCore_DP0/DP1; the hang knob armed for DP1 alone), 16 clients pinned to engine 1
  and one request every 0.25 s to engine 0 (vLLM's X-data-parallel-rank):
    dp-stop   EngineCore_DP1 SIGSTOPped with requests running on it: seconds to direct
              `console --once` and to `status` saying stalled, naming engine 1
    dp-hang   EngineCore_DP1's step blocked by the knob with requests on it: the same
    idle      no load: `status` and `console --once` every --every s for --idle s; any
              answer but ready is a false alarm
    cost      the console (the headless TUI, 1 s interval) on the DP=2 server against a
              single-engine tiny-llama: CPU % of one core over --cost s (idle servers)
    dp-kill   SIGKILL of EngineCore_DP1: seconds to direct `console --once` dead naming it
              (last: vLLM tears the server down)

Prints one row per case: looks made, false alarms (idle) or detection seconds
(min / median / max over --repeat).

    python benchmarks/ranks_detection.py [--idle 600] [--every 5] [--repeat 3] [--cost 60]
        [--cases tp-stop,tp-hang,dp-stop,dp-hang,idle,cost,dp-kill]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OPSCTL = [sys.executable, "-m", "opsctl"]
TP_CASES = ("tp-stop", "tp-hang")
DP_CASES = ("dp-stop", "dp-hang", "idle", "cost", "dp-kill")
BODY = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 48, "ignore_eos": True}


def cli(*args: str) -> tuple[int, dict]:
    r = subprocess.run([*OPSCTL, *args, "--json"], capture_output=True, text=True, timeout=300)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:  # opsctl itself failed: never count that as a verdict
        raise SystemExit(f"opsctl {args[0]} printed no JSON (exit {r.returncode}): "
                         f"{r.stderr[-2000:]}") from None  # fmt: skip


def once(url: str) -> dict:
    return cli("console", "--once", "--no-discover", url)[1]["endpoints"][0]


def until(look, ok, limit: float = 180.0) -> float | None:
    """Seconds until ``ok(look())`` (each look a full CLI call); None past ``limit``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if ok(look()):
            return time.monotonic() - t0
    return None


def spread(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    missed = len(xs) - len(got)
    if not got:
        return "not detected" if xs else "-"
    text = f"{min(got):.1f} / {statistics.median(got):.1f} / {max(got):.1f} s"
    return text + (f" ({missed} not detected)" if missed else "")


def healthy(url: str) -> None:
    if until(lambda: cli("status", url)[0], lambda c: c == 0, 240) is None:
        raise SystemExit(f"{url} did not become healthy again")


def tp_cases(cases: set[str], repeat: int, rows: list[tuple[str, str, str]]) -> None:
    from engine_patches import knobs
    from opsctl.collectors.processes import members
    from tests.conftest import running_engine
    from tests.engine_cores import ClosedLoad

    with tempfile.TemporaryDirectory(prefix="opsctl-ranks-") as tmp:
        hold = Path(tmp) / "hold"
        with running_engine(
            "tiny-llama", load_format="dummy", knobs={knobs.HANG_RANK: f"TP1:{hold}"}, tp=2,
            single_process=False, max_model_len=512, max_num_seqs=16,
        ) as server:  # fmt: skip
            url = server.url
            tp1 = next(p for p, role, _s in members(server.pid) if role == "Worker_TP1")
            warm = ClosedLoad([url], 4, BODY).start()
            until(lambda: warm.done[url], lambda n: n >= 8, 300)
            warm.stop(300)
            for case in (c for c in TP_CASES if c in cases):
                stalled, named = [], []
                for _ in range(repeat):
                    load = ClosedLoad([url], 8, BODY).start()
                    until(lambda: load.done[url], lambda n: n >= 4, 300)  # noqa: B023
                    if case == "tp-stop":
                        os.kill(tp1, signal.SIGSTOP)
                    else:
                        hold.touch()
                    t0 = time.monotonic()
                    stalled.append(until(lambda: once(url)["state"], lambda s: s == "stalled"))
                    culprit = until(
                        lambda: cli("stacks", url)[1],
                        lambda d: [c["role"] for c in d.get("culprits") or ()] == ["Worker_TP1"],
                    )
                    named.append(None if culprit is None else time.monotonic() - t0)
                    os.kill(tp1, signal.SIGCONT)
                    hold.unlink(missing_ok=True)
                    load.stop(300)
                    healthy(url)
                rows.append((case, "console --once stalled", spread(stalled)))
                rows.append((case, "stacks names Worker_TP1", spread(named)))


def dp_cases(a: argparse.Namespace, cases: set[str], rows: list[tuple[str, str, str]]) -> None:
    from engine_patches import knobs
    from tests.conftest import running_engine
    from tests.e2e import test_dp_stall_e2e as dp

    with tempfile.TemporaryDirectory(prefix="opsctl-ranks-") as tmp:
        hold = Path(tmp) / "hold"
        with running_engine(
            "tiny-llama", load_format="dummy", knobs={knobs.HANG_STEP: str(hold)}, dp=2,
            single_process=False, max_model_len=512, max_num_seqs=16,
        ) as server:  # fmt: skip
            url, pid = server.url, dp.core_pid(SimpleNamespace(server=server))
            for case in ("dp-stop", "dp-hang"):
                if case in cases:
                    rows.extend(dp_timed(case, url, pid, hold, a.repeat))
            if "idle" in cases:
                rows.extend(idle(url, a.idle, a.every))
            if "cost" in cases:
                rows.append(("cost", "console CPU, DP=2 server", f"{cost(url, a.cost):.1f} %"))
                rows.append(("cost", "console CPU, one engine", f"{single_cost(a.cost):.1f} %"))
            if "dp-kill" in cases:
                os.kill(pid, signal.SIGKILL)
                took = until(
                    lambda: once(url),
                    lambda e: e["state"] == "dead" and "EngineCore_DP1" in (e["reason"] or ""),
                    60,
                )
                rows.append(("dp-kill", "console --once dead naming it", spread([took])))


def dp_timed(case: str, url: str, pid: int, hold: Path, repeat: int) -> list:
    from tests.e2e import test_dp_stall_e2e as dp

    direct, status = [], []

    def engine1_stalled(e: dict) -> bool:
        return e["state"] == "stalled" and e["reason"].startswith("engine 1 (EngineCore_DP1")

    for _ in range(repeat):
        one = dp.Pinned(url, 1, dp.LONG, clients=16).start()
        zero = dp.Pinned(url, 0, dp.SHORT, every=0.25).start()
        try:
            if case == "dp-stop":
                t0 = dp.stop_with_requests_running(pid, url)
            else:
                dp.hang_with(url, pid, hold, running=True)
                t0 = time.time()
            # seconds from the stop (or the hang) to the look that named engine 1
            seen = until(lambda: once(url), engine1_stalled)
            direct.append(None if seen is None else time.time() - t0)
            said = until(lambda: cli("status", url)[1], engine1_stalled)
            status.append(None if said is None else time.time() - t0)
        finally:
            os.kill(pid, signal.SIGCONT)
            dp.dp1_of(hold).unlink(missing_ok=True)
            one.stop.set()
            zero.stop.set()
        one.halt()
        zero.halt()
        healthy(url)
    return [
        (case, "console --once stalled, engine 1", spread(direct)),
        (case, "status stalled, engine 1", spread(status)),
    ]


def idle(url: str, seconds: float, every: float) -> list:
    """No load for ``seconds``: the live console's own poll (DirectScrapeSource, 1 s, as
    the TUI runs it) on every tick, and the CLI's `status` and `console --once` every
    ``every`` s; any state but ready is a false alarm."""
    import threading

    from opsctl.console import targets
    from opsctl.console.direct import DirectScrapeSource
    from opsctl.console.judge_state import Settings

    src = DirectScrapeSource(targets.from_urls([url]), discover=False, settings=Settings())
    src.start()
    polled: list[str] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):  # the TUI's 1 s interval
            polled.extend(e.state for e in src.collect().endpoints)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    looks = alarms = 0
    odd: list[str] = []
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            t0 = time.monotonic()
            for name, state in (
                ("status", cli("status", url)[1]["state"]),
                ("console --once", once(url)["state"]),
            ):
                looks += 1
                if state != "ready":
                    alarms += 1
                    odd.append(f"{name}: {state}")
            time.sleep(max(0.0, every - (time.monotonic() - t0)))  # the benchmark's own pace
    finally:
        stop.set()
        watcher.join(30)
        src.close()
    live_odd = [st for st in polled if st != "ready"]
    return [
        ("idle", f"CLI: {looks} looks in {seconds:g} s", f"{alarms} false alarms {odd[:3]}"),
        ("idle", f"live console: {len(polled)} polls", f"{len(live_odd)} false alarms "
         f"{sorted(set(live_odd))}"),
    ]  # fmt: skip


def cost(url: str, seconds: float) -> float:
    from benchmarks.console_scale import run_child

    return float(run_child([url], seconds)["cpu_pct"])


def single_cost(seconds: float) -> float:
    from tests.conftest import running_engine

    with running_engine("tiny-llama", load_format="dummy", single_process=False) as server:
        return cost(server.url, seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--idle", type=float, default=600.0, help="seconds of the idle case")
    p.add_argument("--every", type=float, default=5.0, help="seconds between idle looks")
    p.add_argument("--repeat", type=int, default=3, help="runs of each timed case")
    p.add_argument("--cost", type=float, default=60.0, help="seconds of each cost row")
    p.add_argument("--cases", default=",".join(TP_CASES + DP_CASES), help="cases to run")
    a = p.parse_args()
    cases = set(a.cases.split(","))
    if cases - set(TP_CASES + DP_CASES):
        raise SystemExit(f"unknown case in --cases {a.cases}")
    rows: list[tuple[str, str, str]] = []
    try:
        if cases & set(TP_CASES):
            tp_cases(cases, a.repeat, rows)
            print("TP rows:", rows, flush=True)  # kept should a later case fail
        if cases & set(DP_CASES):
            dp_cases(a, cases, rows)
    finally:
        _table(rows)
    return 0


def _table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[1]) for r in rows) if rows else 10
    print(f"{'case':<9} {'what':<{width}}  result (min / median / max)")
    for case, what, result in rows:
        print(f"{case:<9} {what:<{width}}  {result}")


if __name__ == "__main__":
    sys.exit(main())
