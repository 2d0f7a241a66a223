"""Probe: every vLLM process dumps its threads' stacks on SIGUSR2 (``opsctl stacks``).

Every vLLM process of an opsctl run writes the Python stacks of all its threads to
``<run>/stacks/<pid>.txt``.

Python's ``faulthandler`` C-level handler writes the dump from inside the signal
handler, so it works while the main thread is blocked in C (a CUDA synchronisation, a
collective, a lock) and pauses the process only for the write. Nothing runs until the
signal comes: no thread, no per-step hook. vLLM does not use SIGUSR2 (0.26 to 0.34); any
handler already installed for it is chained, so its owner still gets it (never the
default action: chaining to SIG_DFL would terminate the process after the dump).

The ledger records the signal; ``opsctl stacks`` signals only processes whose ledger
says this probe is armed (an unarmed process would die of SIGUSR2's default action).
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import IO

from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe

SIGNAL = signal.SIGUSR2
DIR = "stacks"  # under the run directory
_FILE: dict[
    int, IO[str]
] = {}  # pid -> the open dump file (kept open: the handler writes to its fd)


def path_of(run_dir: str | os.PathLike, pid: int) -> Path:
    """Where process ``pid`` of the run in ``run_dir`` writes its stack dumps."""
    return Path(run_dir) / DIR / f"{pid}.txt"


def apply() -> Outcome:
    """Arm ``faulthandler`` on SIGUSR2 in this process, dumping into the run directory."""
    run = os.environ.get("OPSCTL_RUN_DIR")
    if not run:
        return Outcome(SKIPPED, "no run directory: nowhere to write stacks")
    pid = os.getpid()
    if pid in _FILE:
        return Outcome(APPLIED, "already applied in this process")
    path = path_of(run, pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - must outlive this call
    # chain only to a real handler: chaining to SIG_DFL would run the default action
    # (terminate) after every dump
    previous = signal.getsignal(SIGNAL)
    chain = previous not in (signal.SIG_DFL, signal.SIG_IGN)
    faulthandler.register(SIGNAL, file=fh, all_threads=True, chain=chain)
    _FILE[pid] = fh
    return Outcome(
        APPLIED,
        f"SIG{SIGNAL.name.removeprefix('SIG')} dumps every thread's stack to {DIR}/{pid}.txt",
    )


def revert() -> None:
    """Disarm in this process (tests)."""
    fh = _FILE.pop(os.getpid(), None)
    if fh is not None:
        faulthandler.unregister(SIGNAL)
        fh.close()


PATCH = probe(
    "stack_dump",
    target="faulthandler.register(SIGUSR2) in every vLLM process",
    reason="opsctl stacks: where a hung engine is stuck, without stopping it (issue 35)",
    apply=apply,
    roles=("api_server", "engine_core", "worker", "model_inspector"),
    # where an idle or stuck EngineCore's main thread waits: the verdict names it
    symbols=("vllm.v1.engine.core:EngineCoreProc.run_busy_loop",),
)
