"""Stop the engine of a run another opsctl process started, by ``runs clean``'s rule.

The console's stop action on a server it did not start itself. Only the processes whose pid AND
start time match the run's meta.json (plus their current descendants) are signalled: SIGTERM to
the API server (vLLM shuts its engine down), then SIGTERM to all, then SIGKILL, within ``grace``
seconds. The owner, if alive, sees its engine exit and records the stop itself; an orphan is
reaped (collectors.runs.reap).
"""

from __future__ import annotations

from pathlib import Path

from opsctl.collectors import runs as runs_col


def stop_run(path: Path, grace: float = 15.0) -> runs_col.ReapReport:
    """Stop a live or orphaned run's engine; refuses (``error``) any other state."""
    snap = runs_col.read_run(path)
    a = snap.assessment()
    if a.state == "orphaned":
        return runs_col.reap(path, grace=grace)
    if a.state != "live":
        return runs_col.ReapReport(
            snap.name, (), (), (), (), (), 0.0, f"nothing to stop ({a.state})"
        )
    return runs_col.stop_engine(snap, grace)
