"""engram's certify check as a library call: Engram tables with the server up.

``engram(target, EngramOptions, progress, session)`` (schema ``certify.engram/1``): no
orphaned table on this node (``engram clean``'s dry run), the fill of every table the
server's processes map verified (``engram inspect``; every table of the node when the
server's processes are not on it; another server's tables are named, not judged), and
the model's tables (when it has any) fit in /dev/shm (``engram plan``): the ``opsctl
engram`` calls of :mod:`opsctl.suite.engram.run_tables`, judged for one server by
:mod:`opsctl.suite.engram.judge_hygiene`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks.findings_report import findings_report
from opsctl.checks.report import Report
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import Target
from opsctl.errors import BadInput
from opsctl.suite.engram import judge_hygiene, run_tables

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext


@dataclass(frozen=True, slots=True)
class EngramOptions:
    """The Engram hygiene check's model directory, layout and verify level."""

    model_dir: Path | None = None  # the model's directory (its config tells its tables)
    tp: int = 1
    dp: int = 1
    verify: str = "sample"  # none | sample | full (engram inspect's --verify)


def engram(
    target: Target,
    options: EngramOptions = EngramOptions(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> Report:
    """The Engram hygiene check: no orphaned table, every fill verified, the tables fit /dev/shm."""
    progress(ev.Started("Engram hygiene"))
    with opened(target, session, progress, label="engram-hygiene") as live:
        progress(ev.Phase("engram inspect"))
        pids = server_pids(live)
        inspect = run_tables.inspect(run_tables.InspectOptions(verify=options.verify), progress)
        progress(ev.Phase("engram clean (dry run)"))
        orphans = run_tables.clean(run_tables.CleanOptions(), progress).to_dict()["orphans"]
        capacity = _capacity(options.model_dir or live.model_path, options)
    doc = inspect.to_dict()
    mine, said, others = judge_hygiene.server_tables(doc["tables"], doc["findings"], pids)
    return findings_report(
        "certify.engram",
        judge_hygiene.engram_findings(said, orphans, capacity, others),
        progress,
        tables=[t["name"] for t in mine],
        shm=doc["shm"],
        orphans=orphans,
        capacity=capacity,
    )


def server_pids(live: Any) -> tuple[int, ...]:
    """The processes of the server under check on this node; () when it is not on it.

    Its API server (the one opsctl started, else the process listening on the URL's local
    port) and every descendant."""
    from urllib.parse import urlsplit

    from opsctl.collectors import processes

    root = getattr(live.server, "pid", None)
    if root is None:
        parts = urlsplit(live.url)
        if parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port:
            root = processes.listening_pid(parts.port)
    if root is None:
        return ()
    return (int(root), *processes.descendants(int(root)))


def _capacity(model_dir: Path | None, options: EngramOptions) -> dict[str, Any] | None:
    """The plan's figures for the model's Engram tables; None when it has none."""
    if model_dir is None or not (model_dir / "config.json").is_file():
        return None
    try:
        plan = run_tables.plan(
            run_tables.PlanOptions(model=model_dir, tp=options.tp, dp=options.dp)
        )
    except BadInput:
        return None  # no Engram fields in the config: nothing to place
    doc = plan.to_dict()
    keys = ("total_bytes", "shm_free_bytes", "shm_total_bytes", "fits_shm", "chosen", "reason")
    return {k: doc.get(k) for k in keys}


def certify(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """Engram hygiene as certify runs it (the model directory from the facts)."""
    return engram(ctx.target, EngramOptions(ctx.facts.model_path), progress, ctx.session)
