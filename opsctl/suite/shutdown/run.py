"""shutdown as a library call: every engine a closed session started left nothing behind.

``shutdown(starts, progress)`` (schema ``certify.shutdown/1``): after an engine session
closed, every engine it started left 0 processes and 0 /dev/shm segments: the engine's
own stop report, rechecked afresh (:mod:`opsctl.suite.shutdown.collect`: psutil,
/dev/shm). Rules: :mod:`opsctl.suite.shutdown.judge`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks.findings_report import findings_report
from opsctl.checks.report import Report
from opsctl.checks.session import EngineStart
from opsctl.suite.shutdown import collect, judge

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext


def shutdown(starts: Sequence[EngineStart], progress: ev.Progress = ev.ignore) -> Report:
    """Judge the engines of a closed session: stop reports plus a fresh recheck."""
    progress(ev.Started("shutdown hygiene"))
    progress(ev.Phase(f"rechecking {len(starts)} engine(s)"))
    present = collect.shm_names()
    engines = [_after_stop(i, s, present, collect.still_alive) for i, s in enumerate(starts)]
    return findings_report(
        "certify.shutdown",
        judge.shutdown_findings(engines),
        progress,
        engines=[_shutdown_dict(e) for e in engines],
    )


def _after_stop(index: int, start: EngineStart, present: set[str], alive) -> judge.Shutdown:
    server: Any = start.live.server
    stop = getattr(server, "stop_report", None)
    known: dict[int, float] = dict(getattr(server, "known_pids", {}) or {})
    ours = set(getattr(server, "shm_seen", set())) - set(getattr(server, "shm_before", set()))
    return judge.Shutdown(
        index=index,
        url=start.live.url,
        stopped=stop is not None,
        seconds=stop.seconds if stop else None,
        signals=tuple(stop.signals) if stop else (),
        leftover_pids=tuple(stop.leftover_pids) if stop else (),
        alive_now=tuple(alive(known)),
        shm_removed=tuple(stop.shm_removed) if stop else (),
        shm_kept=tuple(stop.shm_kept) if stop else (),
        shm_left_now=tuple(sorted(ours & present)),
    )


def _shutdown_dict(e: judge.Shutdown) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(e).items()}


def certify(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """Shutdown hygiene of every engine certify's session started."""
    return shutdown(ctx.session.starts, progress)
