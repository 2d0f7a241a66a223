"""Stall detection on a real engine (issue 35): how fast `opsctl status` and `opsctl
console --once` say `stalled`, and whether they ever say it when nothing is wrong.

One tiny-llama engine (dummy weights, the planted-hang test knob armed), then, one case
after the other, each judged by the real CLI in a child process:

  idle      nothing runs: status every --every seconds for --idle seconds; any answer
            but ready is a false alarm
  slow      a closed load of 4 clients while the EngineCore is given 30 % of the time
            (SIGSTOP/SIGCONT slices of 0.3 s / 0.7 s): steps advance, slowly: any
            `stalled` is a false alarm
  sigstop   the EngineCore stopped while idle: seconds from SIGSTOP to `stalled`
            (status reads the stopped process; the canary's own path is the next case)
  hang      the step blocked in planted_hang (no process stopped): seconds to
            `stalled` through the canary, for --canary-timeout 3 s and 10 s
  prefill   a second engine (tests/e2e/test_prefill_e2e.py's 270 M-parameter dummy
            Llama, 256-token steps) prefills a 4,002-token prompt --repeat times (~23 s
            each on 2 idle cores, no step or token published until it ends): `status`
            and `console --once` (10 s window) one after the other while it runs; any
            `stalled` is a false alarm

Prints one row per case: checks made, false alarms, detection seconds (min/median/max
over --repeat), and the canary's cost on the engine's counters (requests and generation
tokens added per status call on an idle engine).

    python benchmarks/stall_detection.py [--idle 600] [--every 5] [--repeat 3]
        [--cases idle,slow,sigstop,hang,prefill]
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
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OPSCTL = [sys.executable, "-m", "opsctl"]


def status(url: str, *flags: str) -> dict:
    r = subprocess.run(
        [*OPSCTL, "status", url, "--json", *flags], capture_output=True, text=True, timeout=180
    )
    try:
        return json.loads(r.stdout)
    except ValueError:  # opsctl itself failed: say so, never count it as a verdict
        why = r.stderr[-2000:]
        raise SystemExit(f"opsctl status printed no JSON (exit {r.returncode}): {why}") from None


def core_pid(api_pid: int) -> int:
    from opsctl.collectors.processes import process_roles

    return next(p.pid for p in process_roles(api_pid) if p.role == "EngineCore")


def counters(url: str) -> tuple[float, float]:
    from opsctl.domain.metrics import parse_samples

    s = parse_samples(httpx.get(f"{url}/metrics", timeout=10).text)
    return s.get("vllm:request_success_total") or 0.0, s.get("vllm:generation_tokens_total") or 0.0


def until_stalled(url: str, t0: float, *flags: str, limit: float = 120.0) -> float | None:
    while time.monotonic() - t0 < limit:
        if status(url, *flags)["state"] == "stalled":
            return time.monotonic() - t0
    return None


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.1f} / {statistics.median(xs):.1f} / {max(xs):.1f} s"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--idle", type=float, default=600.0, help="seconds of the idle case")
    p.add_argument("--slow", type=float, default=120.0, help="seconds of the slowed case")
    p.add_argument("--every", type=float, default=5.0, help="seconds between checks")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs of each timed case (sigstop, hang, prefill)"
    )
    p.add_argument(
        "--cases",
        default="idle,slow,sigstop,hang,prefill",
        help="comma-separated cases to run, in this order",
    )
    a = p.parse_args()
    cases = set(a.cases.split(","))
    if cases - {"idle", "slow", "sigstop", "hang", "prefill"}:
        raise SystemExit(f"unknown case in --cases {a.cases}")
    if cases - {"prefill"}:
        engine_cases(a, cases)
    if "prefill" in cases:
        prefill_case(a.repeat)
    return 0


def prefill_case(repeat: int) -> None:
    """Long prefills on a real engine: every status / console --once look must say busy."""
    from tests.conftest import running_engine
    from tests.e2e.test_prefill_e2e import PROMPT, prefill_model

    with tempfile.TemporaryDirectory(prefix="opsctl-prefill-") as tmp:
        model = prefill_model(Path(tmp) / "prefill-llama")
        with running_engine(
            str(model), load_format="dummy", max_model_len=4608, max_num_seqs=4,
            extra_args=["--max-num-batched-tokens", "256"],
        ) as s:  # fmt: skip
            url = s.url
            name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            took, looks, alarms = [], 0, []
            for k in range(repeat):
                # a prompt of its own each time: the prefix cache would answer a repeat
                body = {"model": name, "prompt": f"run {k} {PROMPT}", "max_tokens": 1}
                done = threading.Event()

                def ask(body=body, done=done) -> None:
                    t0 = time.monotonic()
                    httpx.post(f"{url}/v1/completions", json=body, timeout=600)
                    took.append(time.monotonic() - t0)
                    done.set()

                threading.Thread(target=ask, daemon=True).start()
                time.sleep(1.0)  # the request reaches the scheduler
                while not done.is_set():
                    states = {"status": status(url)["state"], "console --once": once(url)}
                    if not done.is_set():  # judged while it still prefilled
                        looks += len(states)
                        alarms += [f"{k}: {st}" for k, st in states.items() if st == "stalled"]
                done.wait(600)
    print(
        f"prefill   {repeat} prefills of 4,002 tokens ({spread(took)}), {looks} looks while "
        f"prefilling (status, console --once), false alarms {len(alarms)} {alarms or ''}"
    )


def once(url: str) -> str:
    r = subprocess.run(
        [*OPSCTL, "console", "--once", "--json", "--no-discover", url],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    try:
        (e,) = json.loads(r.stdout)["endpoints"]
    except ValueError:
        raise SystemExit(f"console --once printed no JSON (exit {r.returncode})") from None
    return str(e["state"])


def engine_cases(a: argparse.Namespace, cases: set[str]) -> None:
    """The cases on one tiny-llama engine with the planted-hang knob."""
    from engine_patches import knobs
    from tests.conftest import running_engine

    trigger = Path(tempfile.mkdtemp()) / "hold"
    with running_engine(
        "tiny-llama", load_format="dummy", knobs={knobs.HANG_STEP: str(trigger)}
    ) as s:
        url = s.url
        core = core_pid(s.pid)
        # idle: never stalled; and the canary's cost per call
        if "idle" in cases:
            before, t_end, checks, alarms = counters(url), time.monotonic() + a.idle, 0, 0
            while time.monotonic() < t_end:
                checks += 1
                alarms += status(url)["state"] != "ready"
                time.sleep(a.every)
            after = counters(url)
            cost = ((after[0] - before[0]) / checks, (after[1] - before[1]) / checks)
            print(
                f"idle      {checks} checks in {a.idle:.0f} s, false alarms {alarms}; canary cost per "
                f"status: {cost[0]:.2f} requests, {cost[1]:.2f} generation tokens"
            )
        # slowed: a load while the core runs 30 % of the time
        if "slow" in cases:
            stop = threading.Event()

            def load() -> None:
                body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 64}
                with httpx.Client(timeout=300) as c:
                    while not stop.is_set():
                        c.post(f"{url}/v1/completions", json=body)

            clients = [threading.Thread(target=load, daemon=True) for _ in range(4)]
            for c in clients:
                c.start()
            t_end, checks, alarms = time.monotonic() + a.slow, 0, 0
            while time.monotonic() < t_end:
                os.kill(core, signal.SIGSTOP)
                time.sleep(0.7)
                os.kill(core, signal.SIGCONT)
                time.sleep(0.3)
                if int(time.monotonic()) % max(1, int(a.every)) == 0:
                    checks += 1
                    alarms += status(url, "--canary-timeout", "30s")["state"] == "stalled"
            stop.set()
            print(
                f"slow      {checks} checks in {a.slow:.0f} s (core at 30 %), false alarms {alarms}"
            )
            for c in clients:
                c.join(300)
        # sigstop while idle
        if "sigstop" in cases:
            took = []
            for _ in range(a.repeat):
                t0 = time.monotonic()
                os.kill(core, signal.SIGSTOP)
                try:
                    got = until_stalled(url, t0)
                finally:
                    os.kill(core, signal.SIGCONT)
                if got is not None:
                    took.append(got)
                time.sleep(2)
            print(
                f"sigstop   detected {len(took)}/{a.repeat}: {spread(took)} (status, stopped process)"
            )
        # planted hang: the canary
        if "hang" in cases:
            for timeout in ("3s", "10s"):
                took = []
                for _ in range(a.repeat):
                    trigger.touch()
                    t0 = time.monotonic()
                    try:
                        got = until_stalled(url, t0, "--canary-timeout", timeout)
                    finally:
                        trigger.unlink(missing_ok=True)
                    if got is not None:
                        took.append(got)
                    time.sleep(2)
                print(
                    f"hang      detected {len(took)}/{a.repeat}: {spread(took)} (canary {timeout})"
                )


if __name__ == "__main__":
    sys.exit(main())
