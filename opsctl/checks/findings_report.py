"""A report that is a list of findings: what certify's own checks share.

liveness, patches, engram and shutdown (opsctl/suite/<name>/) run only under certify and
judge the same way: their judgement (each folder's ``judge*.py``) returns findings, the
verdict follows from the findings alone (:func:`verdict_of`), and their document is their
fields plus those findings and that verdict (:func:`findings_report`; liveness builds its
own, with a progress line per case). This is the one copy of both, in the checks layer
beside :mod:`opsctl.checks.report` because :func:`findings_report` emits progress events
and builds the document: each check's folder keeps only what is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opsctl.checks import events as ev
from opsctl.checks.report import Report
from opsctl.domain.findings import FAIL, Finding


def verdict_of(findings: Sequence[Finding]) -> str:
    """fail on any failure; unverified when something could not be measured; else pass."""
    if any(f.severity == FAIL for f in findings):
        return "fail"
    if any(f.code.endswith(".unverified") for f in findings):
        return "unverified"
    return "pass"


def findings_report(
    schema: str, found: Sequence[Finding], progress: ev.Progress, **fields: Any
) -> Report:
    """The report of ``found``: the document ``schema``, its fields, findings and verdict.

    Before it, as progress: the findings as a table, then the verdict with its headline
    (the first finding that is not ok)."""
    from opsctl.output import document

    verdict = verdict_of(found)
    rows = tuple((f.severity, f.code, f.message) for f in found)
    progress(ev.Table(("severity", "code", "finding"), rows))
    headline = next((f.message for f in found if f.severity != "ok"), found[0].message)
    progress(ev.Finished(verdict, headline))
    return Report(
        verdict,
        document(schema, **fields, findings=[f.to_dict() for f in found], verdict=verdict),
    )
