"""patches as a library call: the engine's patch ledger has no failed patch, no test knob.

``patch_ledger(target, LedgerOptions, progress, session)`` (schema
``certify.patch_ledger/1``) reads the ledger with :func:`opsctl.checks.patches.run`
(the ledger ``opsctl patches`` shows). It needs an opsctl run directory: an engine
opsctl started (its own, or found by URL). Rules: :mod:`opsctl.suite.patches.judge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.checks import events as ev
from opsctl.checks.findings_report import findings_report
from opsctl.checks.report import Report
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import Target
from opsctl.errors import BadInput
from opsctl.suite.patches import judge

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext


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
    summary = judge.ledger_summary(records)
    return findings_report(
        "certify.patch_ledger",
        judge.ledger_findings(records),
        progress,
        url=live.url,
        run_dir=str(run_dir),
        summary=summary,
    )


def certify(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """The patch ledger as certify runs it (the run directory from the facts)."""
    return patch_ledger(ctx.target, LedgerOptions(ctx.facts.run_dir), progress, ctx.session)
