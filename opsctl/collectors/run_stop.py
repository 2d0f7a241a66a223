"""Stop the engine of a run another opsctl process started (the console's stop action on
a server it did not start itself), with the rule ``runs clean`` reaps by: only the
processes whose pid AND start time match the run's meta.json (plus their current
descendants) are signalled: SIGTERM to the API server (vLLM shuts its engine down),
then SIGTERM to all, then SIGKILL, within ``grace`` seconds. The owner, if alive, sees
its engine exit and records the stop itself; an orphan is reaped (collectors.runs.reap).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from opsctl.collectors import runs as col
from opsctl.collectors import shm


def stop_run(path: Path, grace: float = 15.0) -> col.ReapReport:
    """Stop a live or orphaned run's engine; refuses (``error``) any other state."""
    snap = col.read_run(path)
    a = snap.assessment()
    if a.state == "orphaned":
        return col.reap(path, grace=grace)
    if a.state != "live":
        return col.ReapReport(snap.name, (), (), (), (), (), 0.0, f"nothing to stop ({a.state})")
    t0 = time.time()
    procs = col._engine_processes(snap)
    segments = col._held_segments([p.pid for p in procs])
    signals: list[str] = []
    api = [p for p in procs if snap.meta and p.pid == snap.meta.api_pid]
    if api:
        col._signal_all(api, signal.SIGTERM)
        signals.append("SIGTERM api-server")
        col._wait_gone(procs, t0 + grace * 0.6)
    for sig, name, share in ((signal.SIGTERM, "SIGTERM all", 0.8), (signal.SIGKILL, "SIGKILL", 1)):
        if col._living(procs):
            col._signal_all(col._living(procs), sig)
            signals.append(name)
            col._wait_gone(procs, t0 + grace * share)
    leftover = tuple(sorted(p.pid for p in col._living(procs)))
    removed, kept = shm.remove_unheld(segments) if not leftover else ([], [])
    return col.ReapReport(
        snap.name,
        tuple(sorted(p.pid for p in procs)),
        tuple(signals),
        leftover,
        tuple(removed),
        tuple(kept),
        round(time.time() - t0, 3),
        f"{len(leftover)} process(es) survived SIGKILL" if leftover else None,
    )
