"""Take the Python stacks of every process of a local vLLM server tree, without stopping it.

Used by ``opsctl stacks``.

- A process of an opsctl run whose ledger says ``stack_dump`` is armed gets SIGUSR2: its
  faulthandler writes every thread's stack to ``<run>/stacks/<pid>.txt`` from inside the
  signal handler (it works while the main thread is blocked in C). Only the new part of
  the file is read. A process not armed is never signalled: SIGUSR2's default action
  would terminate it.
- Any other process, and a stopped one (it cannot run a signal handler until it is
  continued), is read by py-spy (``py-spy dump --nonblocking``: it reads the process's
  memory without pausing it) when py-spy is installed and the kernel allows tracing;
  else the process gets one line saying why (the true reason: stopped, or not armed
  because opsctl did not start it) and what would allow it (how to install py-spy).
- A process that is not Python (a compiler a worker runs) is not read: nothing to read.

:func:`take` takes them twice, ``interval`` apart, and returns the second take with each
main thread marked moved or not and asleep or not (opsctl.stacks.judge_verdict.settle):
one take cannot tell a rank that is stuck from one that is passing through.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from opsctl.collectors.ledger import read_records
from opsctl.collectors.processes import STOPPED, members
from opsctl.stacks.judge import ProcessStacks, parse_faulthandler, parse_pyspy
from opsctl.stacks.judge_verdict import settle

PROBE = "stack_dump"
SIGNAL = signal.SIGUSR2
STACKS_DIR = "stacks"
SETTLE_S = 0.15  # a dump file unchanged this long after it grew is complete


def armed_pids(run_dir: Path | None) -> set[int]:
    """The processes whose ledger records the stack_dump probe as applied."""
    if run_dir is None:
        return set()
    armed = set()
    for rec in read_records(run_dir):
        for p in rec.get("patches", []):
            if p.get("name") == PROBE and p.get("status") == "applied":
                armed.add(int(rec.get("pid") or 0))
    return armed


def _by_signal(run_dir: Path, pids: list[int], timeout: float) -> dict[int, str]:
    """Signal each pid, wait (``timeout``) until its dump file grew and settled; the new
    text per pid (absent: no dump came)."""
    files = {pid: run_dir / STACKS_DIR / f"{pid}.txt" for pid in pids}
    start = {pid: (f.stat().st_size if f.is_file() else 0) for pid, f in files.items()}
    for pid in pids:
        try:
            os.kill(pid, SIGNAL)
        except OSError:
            files.pop(pid)
    deadline = time.monotonic() + timeout
    last: dict[int, tuple[int, float]] = {}
    done: dict[int, str] = {}
    while files and time.monotonic() < deadline:
        now = time.monotonic()
        for pid, f in list(files.items()):
            size = f.stat().st_size if f.is_file() else 0
            if size <= start[pid]:
                continue
            prev = last.get(pid)
            if prev is None or prev[0] != size:
                last[pid] = (size, now)
            elif now - prev[1] >= SETTLE_S:
                with open(f, encoding="utf-8", errors="replace") as fh:
                    fh.seek(start[pid])
                    done[pid] = fh.read()
                files.pop(pid)
        time.sleep(0.03)
    return done


def pyspy_path() -> str | None:
    """py-spy next to this interpreter (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.is_file() else shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """The kernel's Yama ptrace_scope (0-3); None when it cannot be read."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        return None


def install_hint() -> str:
    """How to install py-spy for this interpreter."""
    return f"{sys.executable} -m pip install py-spy"


def no_pyspy(stopped: bool, armed: bool) -> str:
    """Why a process could not be read without py-spy: the true reason, and the remedy."""
    missing = f"py-spy is not installed ({install_hint()})"
    if stopped and armed:
        return (
            "stopped: its stack handler (SIGUSR2) cannot run until the process is continued; "
            f"py-spy reads a stopped process, but {missing}"
        )
    if stopped:
        return f"stopped, and no stack handler armed (not started by opsctl); {missing}"
    return (
        "no stack handler armed (not started by opsctl: opsctl serve arms one); "
        f"py-spy reads any process, but {missing}"
    )


def _by_pyspy(pid: int, native: bool, timeout: float) -> tuple[list | None, str | None]:
    """(py-spy's threads, None) or (None, why not). Python frames are read without
    pausing the process (``--nonblocking``); C frames need the process paused while
    py-spy unwinds it (py-spy refuses ``--native`` with ``--nonblocking``), so ``native``
    pauses each process for that one read (milliseconds) and nothing else does."""
    exe = pyspy_path()
    if exe is None:
        return None, None
    cmd = [exe, "dump", "--pid", str(pid), "--json"]
    cmd.append("--native" if native else "--nonblocking")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"py-spy gave no dump within {timeout:g} s"
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        text = err[-1] if err else f"exit {r.returncode}"
        if "ermission" in text or "ptrace" in text.lower() or "Operation not permitted" in text:
            scope = ptrace_scope()
            return None, (
                f"py-spy may not trace pid {pid} ({text}): tracing needs the same user and "
                f"kernel.yama.ptrace_scope 0 (now {scope}), or root / CAP_SYS_PTRACE"
            )
        return None, f"py-spy failed: {text}"
    try:
        return json.loads(r.stdout), None
    except ValueError:
        return None, "py-spy printed no JSON"


NOT_PYTHON = ("compiler",)  # roles of processes py-spy cannot read (no Python in them)


SETTLE_READS, SETTLE_STEP_S = 5, 0.02  # a runnable process's state read again, 100 ms at most


def _settled(procs: list[tuple[int, str, str | None]]) -> list[tuple[int, str, str | None]]:
    """``procs`` (pid, role, state), each runnable one's state read again, all together,
    for 100 ms at most: the waiting state it settles into, if it does.

    A process that waits is made runnable for a moment by the previous take's signal, or
    is on its way into its wait; on a loaded host it may sit runnable in the queue for
    longer than the interval (seen: a child blocked on a lock read "running" beside a
    CPU-bound test run, and its stacks read working). One that computes stays runnable."""
    states = {pid: state for pid, _role, state in procs}
    pending = [pid for pid, state in states.items() if state == psutil.STATUS_RUNNING]
    for _ in range(SETTLE_READS):
        if not pending:
            break
        time.sleep(SETTLE_STEP_S)
        for pid in list(pending):
            try:
                now = psutil.Process(pid).status()
            except psutil.Error:
                now = None
            if now != psutil.STATUS_RUNNING:
                pending.remove(pid)
                states[pid] = now or states[pid]
    return [(pid, role, states[pid]) for pid, role, _state in procs]


def take_once(
    root_pid: int, run_dir: Path | None, *, timeout: float = 5.0, native: bool = False
) -> list[ProcessStacks]:
    """One take of the stacks of every process of the tree under ``root_pid``, tree order.

    By signal where the process is armed and running, else by py-spy."""
    procs = _settled(members(root_pid))
    armed = armed_pids(run_dir)
    signalled = [pid for pid, _r, state in procs if pid in armed and state not in STOPPED]
    dumps = _by_signal(run_dir, signalled, timeout) if run_dir and signalled and not native else {}
    out = []
    for pid, role, state in procs:
        shown = "stopped" if state in STOPPED else state
        if pid in dumps:
            threads = parse_faulthandler(dumps[pid])
            out.append(ProcessStacks(pid, role, "signal", threads, shown))
            continue
        if role in NOT_PYTHON:
            out.append(ProcessStacks(pid, role, "none", (), shown, "not a Python process"))
            continue
        doc, why = _by_pyspy(pid, native, timeout)
        if doc is not None:
            out.append(ProcessStacks(pid, role, "py-spy", parse_pyspy(doc), shown))
            continue
        if why is None:  # py-spy is not installed
            why = no_pyspy(shown == "stopped", pid in armed)
        if pid in signalled and not native:
            why = f"armed, but no dump within {timeout:g} s ({why})"
        out.append(ProcessStacks(pid, role, "none", (), shown, why))
    return out


def take(
    root_pid: int,
    run_dir: Path | None,
    *,
    timeout: float = 5.0,
    native: bool = False,
    interval: float = 1.0,
) -> list[ProcessStacks]:
    """The stacks of the tree under ``root_pid``, taken twice ``interval`` apart.

    The second take, each main thread marked moved (its stack changed) and asleep (the
    kernel saw it waiting at both takes); ``interval`` 0: one take, unmarked."""
    first = take_once(root_pid, run_dir, timeout=timeout, native=native)
    if interval <= 0:
        return first
    time.sleep(interval)  # the sampling interval: a stuck thread stays, a working one moves
    return settle(first, take_once(root_pid, run_dir, timeout=timeout, native=native))
