"""certify, the pure part: which checks apply, their findings, verdict and exit code.

Also how each check's report becomes findings, and the human summary rows.

No I/O: :mod:`opsctl.checks.certify` collects the facts (:class:`Subject`), runs the
checks and hands their documents here. The JSON document is built from the
:class:`CheckResult` list, and JUnit XML (:mod:`opsctl.ui.render_junit`) and SARIF
(:mod:`opsctl.ui.render_sarif`) from that document, so the three always agree on which
checks failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsctl.domain import check_registry as reg
from opsctl.domain.check_registry import Subject
from opsctl.domain.findings import FAIL, INFO, WARNING, Finding

SCHEMA = "certify/2"  # opsctl.certify/2: durations in `duration_s`, `state` and `error` added

# what certify found at its target (the document's ``state``; ``error`` says why)
RAN = "ran"  # the server answered, or every engine certify needed started: checks ran
UNREACHABLE = "unreachable"  # no vLLM server answered at the URL (exit 3)
UNAUTHORIZED = "unauthorized"  # it answered 401/403: the API key is missing or wrong (3)
START_FAILED = "start_failed"  # an engine certify started never became healthy
CRASHED = "crashed"  # certify itself failed before its checks (an opsctl bug, exit 1)
INTERRUPTED = "interrupted"  # stopped by Ctrl-C or a signal: what ran so far (exit 130)
STATES = (RAN, UNREACHABLE, UNAUTHORIZED, START_FAILED, CRASHED, INTERRUPTED)
NOT_REACHED = (UNREACHABLE, UNAUTHORIZED, CRASHED)  # no check ran: the error says why
EXIT_UNREACHABLE, EXIT_INTERRUPTED = 3, 130
INTERRUPTED_WHY = "interrupted"

# verdicts of one check in a certification
PASS, UNVERIFIED, FAILED, ERROR, SKIPPED = "pass", "unverified", "fail", "error", "skipped"
# a check whose comparison could not tell right from wrong (opsctl.checks.report.INCONCLUSIVE)
INCONCLUSIVE = "inconclusive"
PASSING = (PASS,)
# ran but not judged (a count it could not derive, a comparison below its noise floor): never
# counted as passed; certify's verdict is then inconclusive and its exit code 1
NOT_JUDGED = (UNVERIFIED, INCONCLUSIVE)
VERDICTS = (PASS, UNVERIFIED, INCONCLUSIVE, FAILED, ERROR, SKIPPED)

# the check that answers for reachability: certify's result when no server answered
LIVENESS = "liveness"


def certify_checks() -> tuple[str, ...]:
    """The checks certify runs, in the order they run (the registered ones)."""
    return reg.names(reg.CERTIFY)


def title(check: str) -> str:
    """The title of ``check``'s row and panel."""
    try:
        return reg.get(check).title
    except KeyError:
        return check


def skip_reason(check: str, s: Subject) -> str | None:
    """Why ``check`` cannot run on ``s`` (None: it applies)."""
    rule = reg.get(check).certify
    if rule is None:
        raise ValueError(f"{check!r} is not a certify check")
    return rule(s)


def excluded_by_config(check: str, s: Subject) -> str | None:
    """Why the server's own configuration leaves ``check`` out of the default set, or None.

    The check's ``excluded`` rule. Unlike :func:`skip_reason` the check can still run:
    asked for by name (``--checks``), it runs and judges fail-closed.
    """
    rule = reg.get(check).excluded
    return rule(s) if rule is not None else None


def parse_list(text: str | None, flag: str) -> tuple[str, ...]:
    """``"usage, kv-fail"`` -> ("usage", "kv-fail"); unknown names are ValueError."""
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    known = certify_checks()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"{flag}: unknown check(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return names


@dataclass(frozen=True, slots=True)
class Selection:
    """The checks to run and those skipped with their reasons (in certify's order)."""

    run: tuple[str, ...]
    skipped: Mapping[str, str]


def select(s: Subject, only: Sequence[str] = (), skip: Sequence[str] = ()) -> Selection:
    """Applicable checks minus ``skip`` (or only ``only``).

    A check named in ``only`` that cannot run is ValueError (the command's exit 2), with the
    reason.
    """
    refused = [f"{c}: {skip_reason(c, s)}" for c in only if skip_reason(c, s)]
    if refused:
        raise ValueError("cannot run " + "; ".join(refused))
    both = sorted(set(only) & set(skip))
    if both:
        raise ValueError(f"{', '.join(both)} given to both --checks and --skip")
    run: list[str] = []
    skipped: dict[str, str] = {}
    for c in certify_checks():
        why = skip_reason(c, s)
        if why is None and c not in only:
            why = excluded_by_config(c, s)
        if why is None and c in skip:
            why = "skipped on request (--skip)"
        elif why is None and only and c not in only:
            why = "not selected (--checks)"
        if why is None:
            run.append(c)
        else:
            skipped[c] = why
    return Selection(tuple(run), skipped)


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of a certification."""

    check: str
    verdict: str  # pass | unverified | fail | error | skipped
    seconds: float = 0.0
    reason: str | None = None  # skipped: why; error: the error line
    findings: tuple[Finding, ...] = ()
    engines: tuple[int, ...] = ()  # indexes of the engine starts that served it
    timed_out: bool = False
    report: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def title(self) -> str:
        """The check's title, as certify's registry names it."""
        return title(self.check)

    def first_finding(self) -> Finding | None:
        """The finding a summary line shows: the first failure, else warning, else info."""
        for severity in (FAIL, WARNING, INFO):
            for f in self.findings:
                if f.severity == severity:
                    return f
        return None

    def headline(self) -> str:
        """One line: the skip/error reason or the first finding's message."""
        if self.verdict in (SKIPPED, ERROR) and self.reason:
            return self.reason
        f = self.first_finding()
        return f.message if f is not None else ""

    def to_dict(self) -> dict[str, Any]:
        """The result as the ``certify`` document's ``checks`` list holds it."""
        return {
            "check": self.check,
            "title": self.title,
            "verdict": self.verdict,
            "duration_s": round(self.seconds, 2),
            "reason": self.reason,
            "timed_out": self.timed_out,
            "engines": list(self.engines),
            "first_finding": self.headline() or None,
            "findings": [f.to_dict() for f in self.findings],
            "report": dict(self.report) if self.report is not None else None,
        }


def skipped(check: str, reason: str) -> CheckResult:
    """The result of a check that did not run, with why."""
    return CheckResult(check, SKIPPED, reason=reason)


def errored(
    check: str, message: str, seconds: float, timed_out: bool, engines: Sequence[int] = ()
) -> CheckResult:
    """The result of a check that crashed or timed out: one FAIL finding with the message."""
    code = f"{check}.timeout" if timed_out else f"{check}.error"
    finding = Finding(FAIL, code, message)
    return CheckResult(check, ERROR, seconds, message, (finding,), tuple(engines), timed_out)


def not_reached(message: str, seconds: float, state: str = UNREACHABLE) -> list[CheckResult]:
    """The results when certify never reached its checks: liveness failed, the rest skipped.

    ``liveness`` failed with the reason (code ``liveness.unreachable`` or
    ``liveness.unauthorized``: no vLLM server answered us), or errored when certify itself
    failed (state ``crashed``: ``liveness.error``); every other check skipped, saying why.
    One failed test case in JUnit, one SARIF result.
    """
    if state == CRASHED:
        first = errored(LIVENESS, message, seconds, False)
        why = "not run: certify failed before its checks"
    else:
        finding = Finding(FAIL, f"{LIVENESS}.{state}", message)
        first = CheckResult(LIVENESS, FAILED, seconds, message, (finding,))
        why = "not run: no vLLM server answered"
    return [first, *(skipped(c, why) for c in certify_checks() if c != LIVENESS)]


def judged(
    check: str, doc: Mapping[str, Any], seconds: float, engines: Sequence[int] = ()
) -> CheckResult:
    """A finished check: its verdict and findings from its own JSON document."""
    verdict = str(doc.get("verdict") or PASS)
    findings = findings_of(check, doc)
    if verdict == FAILED and not any(f.severity == FAIL for f in findings):
        findings = (Finding(FAIL, f"{check}.failed", f"{check} failed (see its report)"), *findings)
    if verdict not in (PASS, *NOT_JUDGED, FAILED):
        verdict = FAILED
    return CheckResult(check, verdict, seconds, None, findings, tuple(engines), False, doc)


def findings_of(check: str, doc: Mapping[str, Any]) -> tuple[Finding, ...]:
    """A check's findings as Finding objects, from the check's document.

    Its ``findings`` list where it has one, then those its declaration reads from the rest
    of its document (``Check.findings``: e.g. invariance's reasons and warnings, which carry
    no codes). Test-knob warnings become certify.test_knobs.
    """
    out: list[Finding] = []
    for f in doc.get("findings") or ():
        if isinstance(f, Mapping) and f.get("code"):
            details = f.get("details")
            out.append(
                Finding(
                    str(f.get("severity", INFO)),
                    str(f["code"]),
                    str(f.get("message", "")),
                    dict(details) if isinstance(details, Mapping) else {},
                )
            )
    more = reg.get(check).findings if check in reg.names() else None
    if more is not None:
        out.extend(more(doc))
    for w in doc.get("warnings") or ():
        if str(w).startswith("TEST KNOBS"):
            out.append(Finding(WARNING, "certify.test_knobs", str(w)))
    return tuple(out)


def overall(results: Sequence[CheckResult]) -> str:
    """pass: every check that ran passed; fail: any failed or errored; else inconclusive.

    Inconclusive when nothing failed but a check ran without a judgement (unverified,
    inconclusive): never a pass."""
    ran = [r for r in results if r.verdict != SKIPPED]
    if all(r.verdict in PASSING for r in ran):
        return PASS
    return INCONCLUSIVE if all(r.verdict in (*PASSING, *NOT_JUDGED) for r in ran) else FAILED


def exit_code(results: Sequence[CheckResult], state: str = RAN) -> int:
    """The certify exit code: 0 pass, 1 failed, 3 unreachable, 4 only timeouts, 130 stop.

    3 when no vLLM server answered, 130 when interrupted; else 0 all applicable checks passed; 1
    any failed (or errored); 4 when the only problems are checks that timed out (nothing failed
    on its own findings).
    """
    if state in (UNREACHABLE, UNAUTHORIZED):
        return EXIT_UNREACHABLE
    if state == INTERRUPTED:
        return EXIT_INTERRUPTED
    bad = [r for r in results if r.verdict in (FAILED, ERROR)]
    if not bad:
        return 1 if any(r.verdict in NOT_JUDGED for r in results) else 0
    return 4 if all(r.timed_out for r in bad) else 1


def counts(results: Sequence[CheckResult]) -> dict[str, int]:
    """Results per verdict, and ``run``: the results not skipped."""
    out = {v: 0 for v in VERDICTS}
    for r in results:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    out["run"] = len(results) - out[SKIPPED]
    return out


def model_of(doc: Mapping[str, Any]) -> str | None:
    """The certified model's name in a document (``fingerprint.model.name``)."""
    model = ((doc.get("fingerprint") or {}).get("model")) or {}
    return model.get("name") if isinstance(model, Mapping) else None


def conclusion(doc: Mapping[str, Any]) -> tuple[int, str]:
    """The command's exit code and its one stderr line for a certify document.

    The error when nothing was certified (unreachable 3, crashed 1), the checks asked for that
    cannot run here (2), else the summary with what failed (1) or timed out (4).
    """
    if doc["state"] in NOT_REACHED:
        return int(doc["exit_code"]), str(doc["error"])
    if doc["refused"]:
        return 2, f"asked for but cannot run here: {', '.join(doc['refused'])}"
    s = doc["summary"]
    unjudged = s.get(UNVERIFIED, 0) + s.get(INCONCLUSIVE, 0)
    line = (
        f"{s['run']} run, {s[PASS]} passed, {s[FAILED]} failed, "
        + (f"{unjudged} not judged, " if unjudged else "")
        + f"{s[ERROR]} errored, {s[SKIPPED]} skipped, {s['engine_starts']} engine start(s)"
    )
    code = int(doc["exit_code"])
    if code == 0:
        return 0, f"certify passed: {line}"
    if code == 4:
        return 4, f"certify: timed out ({line})"
    failed = [c["check"] for c in doc["checks"] if c["verdict"] in (FAILED, ERROR)]
    if not failed:
        unjudged = [c["check"] for c in doc["checks"] if c["verdict"] in NOT_JUDGED]
        return code, f"certify inconclusive: {', '.join(unjudged)} not judged ({line})"
    return code, f"certify failed: {', '.join(failed)} ({line})"
