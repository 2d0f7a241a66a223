"""The lifetime policy for every rank, on real TP=2 and DP=2 engines (issue 44): SIGINT,
SIGTERM, SIGHUP and SIGKILL of `opsctl serve --tp 2` / `--dp 2` leave no rank, no DP
coordinator, no /dev/shm segment its tree held and nothing in its $TMPDIR.

Cheap: dummy weights, and the signal as soon as every rank process exists (for TP, once
the ranks hold their `vllm_dist_*-cpushm_*` segments: the ones vLLM never unlinks). On
main, SIGKILL of opsctl left both TP segments behind (the engine shut itself down, but
nobody removed them). Here SIGKILL, for TP and DP: the owner gone without a word, each rank
must still die with it. Every polite signal reaches one handler (opsctl.engine.lifetime:
SIGHUP, SIGTERM and SIGINT in test_lifetime_e2e.py, on one rank) and then the stop every
command uses; that stop of every TP rank, under the operator's own binding, is judged on the
patched `diag kv-fail --tp 2` run (test_ranks_diag_e2e.py). TP SIGINT mid-start and DP
SIGTERM passed here and left the tier for time (one TP=2 and one DP=2 start each); the
segments a stop races with while ranks start are tests/unit/test_engine_server.py's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from opsctl.domain import ranks
from opsctl.engine.server import free_port
from tests.e2e.test_lifetime_e2e import tree
from tests.e2e.test_serve_e2e import gone, left_in, served
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

START_S = 400.0  # the engine lock may be held by another test's engine first
# the rank processes each layout must show before the signal (vLLM 0.32's titles)
WANT = {
    "tp": ["EngineCore", "Worker_TP0", "Worker_TP1"],
    "dp": ["DPCoordinator", "EngineCore_DP0", "EngineCore_DP1", "Worker", "Worker"],
}


def roles(root: int) -> dict[int, str]:
    """pid -> vLLM role of every process under ``root`` that has one."""
    out = {}
    for pid in tree(root):
        try:
            rank = ranks.parse_title(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            continue
        if rank is not None:
            out[pid] = rank.role
    return out


def every_rank(proc, layout: str) -> dict[int, str] | None:
    """The tree's roles once every rank of ``layout`` runs (and, for TP, holds its
    cpushm segment); None before."""
    found = roles(proc.pid)
    if sorted(found.values()) != sorted(WANT[layout]):
        return None
    if layout == "tp":
        proc.shm.scan()
        if len([n for n in proc.shm.names() if "-cpushm_" in n]) < 2:
            return None
    return found


@pytest.mark.parametrize(
    ("layout", "sig"),
    [
        ("tp", signal.SIGKILL),
        ("dp", signal.SIGKILL),
    ],
    ids=["tp-sigkill", "dp-sigkill"],
)
def test_a_signal_to_serve_leaves_no_rank_and_no_segment(short_tmp, layout, sig):
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # opsctl derives it from the CPUs
    port = free_port()
    args = ("tiny-llama", "--load-format", "dummy", "--eager", "--port", str(port))
    with served(*args, f"--{layout}", "2", env=env) as proc:
        found = wait_until(
            lambda: every_rank(proc, layout), START_S, f"every {layout} rank", proc.poll
        )
        pids = tree(proc.pid)[1:]  # the engine's processes (not opsctl)
        engine = [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)]
        try:
            _signal_and_judge(proc, layout, sig, found, pids, short_tmp, port)
        finally:  # a failed test leaves no orphan (psutil never signals a reused pid)
            for p in engine:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _said(port: int) -> str:
    """What opsctl's engine plugin said in the server log of the run on ``port``."""
    runs = sorted((Path(os.environ["OPSCTL_HOME"]) / "runs").glob(f"*-serve-*-{port}"))
    if not runs:
        return "(no run directory)"
    log = (runs[-1] / "server.log").read_text(errors="replace").splitlines()
    return "\n".join(line for line in log if line.startswith("[opsctl]"))


def _survivors(pids) -> str:
    """Each engine process still running (not a zombie): what it is and where it waits
    (py-spy's dump of its Python stacks), for the failure message."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            head = f"{pid} {p.status()} ppid {p.ppid()} {' '.join(p.cmdline())[:160]}"
        except psutil.Error:
            continue
        spy = Path(sys.executable).with_name("py-spy")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            dump = subprocess.run(
                [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=10
            )
            head += "\n" + (dump.stdout or dump.stderr)
        out.append(head)
    return "\n".join(out)


def _signal_and_judge(proc, layout, sig, found, pids, short_tmp, port) -> None:
    """Signal opsctl once every rank runs; nothing of the engine may be left."""
    held = set(proc.shm.names())
    t0 = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(120)  # stop: polite phase, SIGTERMs, SIGKILL and its wait (30 s)
    wait_until(lambda: gone(pids), 20, f"{layout} ranks {found} to exit", lambda: _survivors(pids))
    print(f"{layout} {sig.name}: every rank gone {time.monotonic() - t0:.1f} s after it")
    assert rc == -signal.SIGKILL
    left = proc.shm.left()
    assert left == set(), f"held {sorted(held)}, left {left}; the engine said:\n{_said(port)}"
    assert left_in(short_tmp) == []
