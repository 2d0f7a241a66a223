"""certify over a fleet, the pure part: names, deadline results, verdict and summary.

The targets' names, a target's results when its deadline passed, the fleet document's verdict, exit
code and summary rows.

No I/O: :mod:`opsctl.checks.certify_fleet` runs one certification per target (each a
``certify/2`` document, :mod:`opsctl.domain.certify`) and hands them here. The fleet
document (``opsctl.certify.fleet/1``) keeps each target's certify document whole (less
its ``schema``) beside the target's ``name`` and ``labels``, so a target's verdict,
fingerprint and checks read the same as ``opsctl certify URL --json`` prints them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain import certify as certify_dom
from opsctl.domain.findings import FAIL, Finding

SCHEMA = "certify.fleet/1"
DEADLINE = "deadline"  # a target's state: its certification passed --timeout (not finished)
INTERRUPTED = certify_dom.INTERRUPTED


DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class FleetTarget:
    """One target of a fleet: its unique name, normalised URL, labels and API key."""

    name: str
    url: str
    labels: tuple[tuple[str, str], ...] = ()
    api_key: str | None = None


def duplicate(values: Sequence[str]) -> str | None:
    """The first value that appears twice (None: all distinct)."""
    seen: set[str] = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    return None


@dataclass(frozen=True, slots=True)
class Done:
    """A check that finished before the deadline, as its progress event told it."""

    verdict: str
    detail: str
    seconds: float


def deadline_results(
    done: Mapping[str, Done], running: str | None, seconds: float, why: str, deadline: bool
) -> list[certify_dom.CheckResult]:
    """The results of a certification stopped from outside (``why``).

    Finished checks keep their verdict; the check running then is an error case (timed out when
    ``deadline``); the rest are skipped, saying why. At a ``deadline``, liveness when it had not
    passed is a FAILED case (``liveness.deadline``: no vLLM server gave its answers in time; a
    dead or hung target is a failed liveness case, never a missing one).
    """
    out: dict[str, certify_dom.CheckResult] = {}
    for check, d in done.items():
        findings: tuple[Finding, ...] = ()
        if d.verdict in (certify_dom.FAILED, certify_dom.ERROR):
            findings = (Finding(FAIL, f"{check}.{d.verdict}", d.detail or d.verdict),)
        reason = d.detail if d.verdict in (certify_dom.SKIPPED, certify_dom.ERROR) else None
        out[check] = certify_dom.CheckResult(check, d.verdict, d.seconds, reason, findings)
    if deadline and certify_dom.LIVENESS not in out:
        finding = Finding(FAIL, f"{certify_dom.LIVENESS}.{DEADLINE}", why)
        out[certify_dom.LIVENESS] = certify_dom.CheckResult(
            certify_dom.LIVENESS, certify_dom.FAILED, seconds, why, (finding,)
        )
    if running and running not in out:
        out[running] = certify_dom.errored(running, why, seconds, deadline)
    for c in certify_dom.certify_checks():
        out.setdefault(c, certify_dom.skipped(c, f"not run: {why}"))
    return [out[c] for c in certify_dom.certify_checks()]


def entry(target: FleetTarget, doc: Mapping[str, Any]) -> dict[str, Any]:
    """A target's part of the fleet document: name, labels and its certify document."""
    body = {k: v for k, v in doc.items() if k != "schema"}
    return {"name": target.name, "labels": dict(target.labels), **body}


def passed(entry: Mapping[str, Any]) -> bool:
    """True when the target's certification exited 0."""
    return entry.get("exit_code") == 0


def fleet_fields(entries: Sequence[Mapping[str, Any]], interrupted: bool) -> dict[str, Any]:
    """The fleet document's verdict, state, exit code and summary.

    Exit code 0: every target passed; 1: any did not; 130: interrupted.
    """
    ok = [e for e in entries if passed(e)]
    verdict = certify_dom.PASS if entries and len(ok) == len(entries) else certify_dom.FAILED
    code = (
        certify_dom.EXIT_INTERRUPTED if interrupted else (0 if verdict == certify_dom.PASS else 1)
    )
    return {
        "verdict": verdict,
        "state": INTERRUPTED if interrupted else certify_dom.RAN,
        "exit_code": code,
        "summary": {
            "targets": len(entries),
            "passed": len(ok),
            "failed": len(entries) - len(ok),
            "unreachable": sum(e.get("state") in certify_dom.NOT_REACHED for e in entries),
            "deadline": sum(e.get("state") == DEADLINE for e in entries),
        },
    }


def conclusion(doc: Mapping[str, Any]) -> tuple[int, str]:
    """The command's exit code and its one stderr line."""
    s = doc["summary"]
    line = f"{s['targets']} target(s): {s['passed']} passed, {s['failed']} failed"
    code = int(doc["exit_code"])
    if code == 0:
        return 0, f"certify passed on every target: {line}"
    if code == certify_dom.EXIT_INTERRUPTED:
        return code, f"certify interrupted ({line})"
    bad = [e["name"] for e in doc["targets"] if not passed(e)]
    return code, f"certify failed on {', '.join(bad)} ({line})"
