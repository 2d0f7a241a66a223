"""Hygiene checks certify runs besides the diagnostics, as library calls:

- ``patch_ledger(target, LedgerOptions, progress, session)`` (schema
  ``certify.patch_ledger/1``): the engine's patch ledger (read with
  :func:`opsctl.checks.patches.run`) has no failed patch and no test knob active. Needs
  an opsctl run directory: an engine opsctl started (its own or found by URL).
- ``engram(target, EngramOptions, progress, session)`` (``certify.engram/1``): Engram
  tables with the engine up: no orphaned table on this node (``engram.clean`` dry run),
  the fill of every table the server's processes map verified (``engram.inspect``; every
  table of the node when the server's processes are not on it; another server's tables
  are named, not judged), and the model's tables (when it has any) fit in /dev/shm
  (``engram.plan``).
- ``shutdown(starts, progress)`` (``certify.shutdown/1``): after an engine session
  closed, every engine it started left 0 processes and 0 /dev/shm segments: the
  engine's own stop report, rechecked afresh (psutil, /dev/shm).

Rules: :mod:`opsctl.domain.certify_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks.report import Report
from opsctl.checks.session import EngineSession, EngineStart, opened
from opsctl.checks.target import Target
from opsctl.domain import certify_checks as dom

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext
from opsctl.domain.findings import Finding
from opsctl.errors import BadInput


def _report(schema: str, found: Sequence[Finding], progress: ev.Progress, **fields: Any) -> Report:
    from opsctl.output import document

    verdict = dom.verdict_of(found)
    rows = tuple((f.severity, f.code, f.message) for f in found)
    progress(ev.Table(("severity", "code", "finding"), rows))
    headline = next((f.message for f in found if f.severity != "ok"), found[0].message)
    progress(ev.Finished(verdict, headline))
    return Report(
        verdict,
        document(schema, **fields, findings=[f.to_dict() for f in found], verdict=verdict),
    )


# ---- patch ledger ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerOptions:
    """Where the patch ledger check reads the ledger of a URL's run."""

    run_dir: Path | None = None  # a URL's run directory when not found from the URL


def patch_ledger(
    target: Target,
    options: LedgerOptions = LedgerOptions(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> Report:
    """The patch ledger check: no failed patch and no test knob active in the engine's ledger."""
    from opsctl.checks import patches

    progress(ev.Started("patch ledger"))
    with opened(target, session, progress, label="patch-ledger") as live:
        run_dir = options.run_dir or live.run_dir
        if run_dir is None:
            raise BadInput(
                f"no opsctl run directory for {live.url}: the patch ledger cannot be read",
                hint="certify an engine opsctl starts (--model) or one started by opsctl serve",
            )
        progress(ev.Phase(f"reading the ledger of {run_dir}"))
        records = patches.run(patches.Options(run_dir=run_dir)).to_dict()["processes"]
    summary = dom.ledger_summary(records)
    return _report(
        "certify.patch_ledger",
        dom.ledger_findings(records),
        progress,
        url=live.url,
        run_dir=str(run_dir),
        summary=summary,
    )


# ---- Engram hygiene --------------------------------------------------------------------------


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
    from opsctl.checks import engram as tables

    progress(ev.Started("Engram hygiene"))
    with opened(target, session, progress, label="engram-hygiene") as live:
        progress(ev.Phase("engram inspect"))
        pids = server_pids(live)
        inspect = tables.inspect(tables.InspectOptions(verify=options.verify), progress)
        progress(ev.Phase("engram clean (dry run)"))
        orphans = tables.clean(tables.CleanOptions(), progress).to_dict()["orphans"]
        capacity = _capacity(options.model_dir or live.model_path, options)
    doc = inspect.to_dict()
    mine, said, others = dom.server_tables(doc["tables"], doc["findings"], pids)
    return _report(
        "certify.engram",
        dom.engram_findings(said, orphans, capacity, others),
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
    from opsctl.checks import engram as tables

    if model_dir is None or not (model_dir / "config.json").is_file():
        return None
    try:
        plan = tables.plan(tables.PlanOptions(model=model_dir, tp=options.tp, dp=options.dp))
    except BadInput:
        return None  # no Engram fields in the config: nothing to place
    doc = plan.to_dict()
    keys = ("total_bytes", "shm_free_bytes", "shm_total_bytes", "fits_shm", "chosen", "reason")
    return {k: doc.get(k) for k in keys}


# ---- shutdown hygiene ------------------------------------------------------------------------


def shutdown(starts: Sequence[EngineStart], progress: ev.Progress = ev.ignore) -> Report:
    """Judge the engines of a closed session: stop reports plus a fresh recheck."""
    from opsctl.collectors import certify as col

    progress(ev.Started("shutdown hygiene"))
    progress(ev.Phase(f"rechecking {len(starts)} engine(s)"))
    present = col.shm_names()
    engines = [_after_stop(i, s, present, col.still_alive) for i, s in enumerate(starts)]
    return _report(
        "certify.shutdown",
        dom.shutdown_findings(engines),
        progress,
        engines=[_shutdown_dict(e) for e in engines],
    )


def _after_stop(index: int, start: EngineStart, present: set[str], alive) -> dom.Shutdown:
    server: Any = start.live.server
    stop = getattr(server, "stop_report", None)
    known: dict[int, float] = dict(getattr(server, "known_pids", {}) or {})
    ours = set(getattr(server, "shm_seen", set())) - set(getattr(server, "shm_before", set()))
    return dom.Shutdown(
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


def _shutdown_dict(e: dom.Shutdown) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(e).items()}


def certify_patches(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """The patch ledger as certify runs it (the run directory from the facts)."""
    return patch_ledger(ctx.target, LedgerOptions(ctx.facts.run_dir), progress, ctx.session)


def certify_engram(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """Engram hygiene as certify runs it (the model directory from the facts)."""
    return engram(ctx.target, EngramOptions(ctx.facts.model_path), progress, ctx.session)


def certify_shutdown(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """Shutdown hygiene of every engine certify's session started."""
    return shutdown(ctx.session.starts, progress)
