"""Wall time of `opsctl certify` over a fleet of N URL targets: does it grow with the
slowest target or with N?

Targets: N = 1, 4, 16 generative stand-ins (tests/standins/completions.py behind
/version and /v1/models answers recorded from a real vLLM 0.32 tiny-llama server,
tests/data/vllm_info_tiny_llama.json; /v1/completions and /metrics are the stand-in's
deterministic ones, since liveness needs the counters to move), each row once without
and once with one more target that accepts and never answers (tests/standins/fleet.py).
Every row is the real CLI in a child process (`opsctl certify URL... --json --timeout T
--concurrency C`), its JSON read for each target's own duration; C is every target at
once unless --concurrency is given. Two kinds of rows: `--checks liveness` (the client
does little: what is measured is waiting on the servers) and every URL check that
applies (liveness and invariance; engram skipped: it reads this node's /dev/shm, the
same for every target), where the client's own CPU per target (HTTP, JSON, logprob
comparison: about 0.4 s) adds up on a 2-core machine. Columns: checks, N, hung target,
concurrency, wall time, the slowest target's duration, the sum of the targets'
durations (what one after another would cost), passed / failed, exit code.

    python benchmarks/certify_fleet.py [--sizes 1,4,16] [--timeout 20] [--concurrency C]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.standins.base import serving  # noqa: E402
from tests.standins.completions import Behaviour, handler_for  # noqa: E402
from tests.standins.fleet import hung_server  # noqa: E402

INFO = json.loads((REPO / "tests" / "data" / "vllm_info_tiny_llama.json").read_text())


def recorded_handler():
    base = handler_for(Behaviour(model=INFO["models"]["data"][0]["id"]))

    class Recorded(base):  # type: ignore[valid-type, misc]
        def do_GET(self) -> None:
            if self.path == "/version":
                self._send(200, INFO["version"])
            elif self.path == "/v1/models":
                self._send(200, INFO["models"])
            else:
                super().do_GET()

    return Recorded


def row(n: int, hung: bool, timeout: float, concurrency: int | None, checks: list[str]) -> dict:
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serving(recorded_handler())) for _ in range(n)]
        if hung:
            urls.append(stack.enter_context(hung_server()))
        cmd = [sys.executable, "-m", "opsctl", "certify", *urls, "--json", *checks]
        cmd += ["--timeout", f"{timeout:g}s", "--concurrency", str(concurrency or len(urls))]
        if n + hung == 1:
            cmd += ["--targets", str(_one_target_file(urls[0]))]  # a fleet of one
            cmd.remove(urls[0])
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
        wall = time.monotonic() - t0
    doc = json.loads(r.stdout)
    durations = [t["duration_s"] for t in doc["targets"]]
    verdicts = [t["verdict"] for t in doc["targets"]]
    return {
        "n": n,
        "hung": hung,
        "wall_s": wall,
        "slowest_s": max(durations),
        "sum_s": sum(durations),
        "passed": verdicts.count("pass"),
        "failed": len(verdicts) - verdicts.count("pass"),
        "exit": r.returncode,
        "concurrency": doc["concurrency"],
    }


def _one_target_file(url: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "fleet.toml"
    path.write_text(f'[[targets]]\nname = "one"\nurl = "{url}"\n')
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--timeout", type=float, default=20.0, help="each target's deadline (s)")
    ap.add_argument("--concurrency", type=int, default=None)
    args = ap.parse_args()
    print(
        "| checks | N | + hung | concurrency | wall (s) | slowest target (s) "
        "| sum of targets (s) | passed / failed | exit |"
    )
    print("|" + "---|" * 9)
    modes = {"liveness": ["--checks", "liveness"], "all URL checks": ["--skip", "engram"]}
    for mode, checks in modes.items():
        for n in (int(x) for x in args.sizes.split(",")):
            for hung in (False, True):
                _print(mode, row(n, hung, args.timeout, args.concurrency, checks))


def _print(mode: str, r: dict) -> None:
    print(
        f"| {mode} | {r['n']} | {'yes' if r['hung'] else 'no'} | {r['concurrency']} | "
        f"{r['wall_s']:.1f} | {r['slowest_s']:.1f} | {r['sum_s']:.1f} | "
        f"{r['passed']} / {r['failed']} | {r['exit']} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
