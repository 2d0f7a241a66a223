"""How long taking stacks pauses a process (issue 35: "taking them once pauses no process
longer than py-spy's own non-blocking read"), and what arming costs while unused.

A child Python process stands in for a vLLM process: the stack_dump probe armed (the
real engine_patches module: faulthandler on SIGUSR2 into a run directory), three idle
threads, and a main thread that spins stamping time.perf_counter() and records every
gap between two stamps. The parent takes the child's stacks in each way opsctl can,
--repeat times, and reads the longest gap of the main thread inside each taking's
window against windows of the same length where nothing was taken:

  none        nothing taken (the loop's own jitter: the scheduler, the other core)
  signal      SIGUSR2 to the armed probe (engines opsctl starts: faulthandler writes
              every thread's stack from the signal handler)
  nonblocking py-spy dump --nonblocking (any other server: reads memory, no pause)
  native      py-spy dump --native (stops the process while it unwinds C frames)

It also times the spin loop with the probe armed and disarmed (what arming costs while
nothing is taken: nothing runs until a signal, so the two should match).

    .venv/bin/python benchmarks/stack_pause.py [--repeat 20]
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

REPO = Path(__file__).resolve().parents[1]
PYSPY = Path(sys.executable).parent / "py-spy"

CHILD = r"""
import json, os, sys, threading, time
arm = sys.argv[1] == "armed"
if arm:
    from engine_patches.patches import stack_dump
    assert stack_dump.apply().status == "applied"
stop = threading.Event()
for _ in range(3):
    threading.Thread(target=stop.wait, daemon=True).start()
gaps = []  # (time of the gap's end, its length)
loops = 0
print("ready", flush=True)
end = time.perf_counter() + float(sys.argv[2])
last = time.perf_counter()
while last < end:
    now = time.perf_counter()
    if now - last > 2e-4:
        gaps.append((now, now - last))
    last = now
    loops += 1
print(json.dumps({"gaps": gaps, "loops": loops}), flush=True)
"""


def child(run_dir: Path, armed: bool, seconds: float) -> subprocess.Popen:
    """The stand-in process, started and past its arming (it printed ``ready``)."""
    env = {**os.environ, "OPSCTL_RUN_DIR": str(run_dir), "PYTHONPATH": str(REPO)}
    mode = "armed" if armed else "bare"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def take(how: str, pid: int, run_dir: Path) -> None:
    """Take the stacks of ``pid`` one way; return once they are taken."""
    if how == "signal":
        dump = run_dir / "stacks" / f"{pid}.txt"
        before = dump.stat().st_size if dump.exists() else 0
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while (dump.stat().st_size if dump.exists() else 0) == before:
            if time.monotonic() > deadline:
                raise SystemExit("the armed probe wrote no dump within 5 s")
            time.sleep(0.001)
    elif how in ("nonblocking", "native"):
        out = subprocess.run(
            [str(PYSPY), "dump", "--pid", str(pid), f"--{how}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise SystemExit(f"py-spy dump --{how} failed: {out.stderr.strip()}")


def longest(gaps: list, start: float, end: float) -> float:
    """The longest gap of the main thread that ended within [start, end]."""
    return max((g for t, g in gaps if start <= t <= end), default=0.0)


def measure(how: str, repeat: int) -> tuple[list[float], list[float]]:
    """Longest main-thread pause (s) in each of ``repeat`` windows of taking ``how``, and
    how long each taking took (s)."""
    with tempfile.TemporaryDirectory(prefix="opsctl-stack-pause-") as tmp:
        run_dir = Path(tmp)
        proc = child(run_dir, armed=True, seconds=repeat * 0.6 + 3)
        windows, took = [], []
        time.sleep(0.3)
        for _ in range(repeat):
            t0 = time.perf_counter()
            take(how, proc.pid, run_dir)
            t1 = time.perf_counter()
            took.append(t1 - t0)
            if how == "none":
                t1 = t0 + 0.05  # a window as long as a short taking
            windows.append((t0, t1 + 0.002))
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=60)
        gaps = json.loads(out)["gaps"]  # perf_counter is one clock for every process
        return [longest(gaps, a, b) for a, b in windows], took


def spin_rate(armed: bool, seconds: float) -> float:
    """Loop iterations per second of the child, the probe armed or not, nothing taken."""
    with tempfile.TemporaryDirectory(prefix="opsctl-stack-pause-") as tmp:
        proc = child(Path(tmp), armed=armed, seconds=seconds)
        out, _ = proc.communicate(timeout=60)
        return json.loads(out)["loops"] / seconds


def main() -> None:
    """Print the pause of each way of taking, and the spin rate armed vs bare."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if not PYSPY.is_file():
        raise SystemExit(f"py-spy not found next to {sys.executable}")
    print("pause: the longest gap of the spinning main thread while the stacks were taken")
    print("(gaps under 0.2 ms are not recorded: 0.00 = none as long); take: the taking's time")
    head = f"{'way':<12} {'takes':>5} {'pause median':>12} {'p90':>6} {'max ms':>7}"
    print(f"{head} {'take median ms':>15}")
    for how in ("none", "signal", "nonblocking", "native"):
        got, took = measure(how, args.repeat)
        pauses = sorted(p * 1000 for p in got)
        p90 = pauses[min(len(pauses) - 1, int(0.9 * len(pauses)))]
        print(
            f"{how:<12} {len(pauses):>5} {statistics.median(pauses):>12.2f} {p90:>6.2f} "
            f"{pauses[-1]:>7.2f} {statistics.median(took) * 1000:>15.1f}"
        )
    bare = [spin_rate(False, 3.0) for _ in range(3)]
    armed = [spin_rate(True, 3.0) for _ in range(3)]
    print(
        f"spin loop, nothing taken: bare {statistics.median(bare) / 1e6:.2f} M/s, "
        f"armed {statistics.median(armed) / 1e6:.2f} M/s "
        f"({statistics.median(armed) / statistics.median(bare) - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
