"""shutdown, pure: each engine's stop report and a fresh recheck into findings.

The recheck (processes still running, segments still in /dev/shm) is
:mod:`opsctl.suite.shutdown.collect`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opsctl.domain.findings import FAIL, INFO, OK, Finding


@dataclass(frozen=True, slots=True)
class Shutdown:
    """One engine after the session closed: its stop report and a fresh recheck."""

    index: int
    url: str
    stopped: bool  # it has a stop report
    seconds: float | None
    signals: tuple[str, ...]
    leftover_pids: tuple[int, ...]  # the stop report's
    alive_now: tuple[int, ...]  # the recheck's: its processes still running
    shm_removed: tuple[str, ...]
    shm_kept: tuple[str, ...]  # the stop report's: segments it could not remove
    shm_left_now: tuple[str, ...]  # the recheck's: its segments still in /dev/shm


def shutdown_findings(engines: Sequence[Shutdown]) -> list[Finding]:
    """Findings of the shutdown check: engines not stopped, processes or segments left."""
    if not engines:
        return [Finding(INFO, "shutdown.no_engine", "no engine was started")]
    out: list[Finding] = []
    for e in engines:
        where = f"engine {e.index} ({e.url})"
        pids = sorted(set(e.leftover_pids) | set(e.alive_now))
        segments = sorted(set(e.shm_kept) | set(e.shm_left_now))
        if not e.stopped:
            out.append(Finding(FAIL, "shutdown.not_stopped", f"{where} was never stopped"))
        if pids:
            out.append(
                Finding(
                    FAIL,
                    "shutdown.processes",
                    f"{where}: {len(pids)} process(es) left after stop: {pids}",
                    {"pids": pids},
                )
            )
        if segments:
            out.append(
                Finding(
                    FAIL,
                    "shutdown.segments",
                    f"{where}: {len(segments)} /dev/shm segment(s) left: {segments[:5]}",
                    {"segments": segments},
                )
            )
        if e.stopped and not pids and not segments:
            out.append(
                Finding(
                    OK,
                    "shutdown.clean",
                    f"{where}: stopped in {e.seconds or 0:.1f} s "
                    f"({', '.join(e.signals) or 'no signal needed'}); 0 processes and 0 "
                    f"segments left ({len(e.shm_removed)} removed)",
                )
            )
    return out
