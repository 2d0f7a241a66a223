"""certify as a library call: every applicable check against one target, one report.

Every applicable check against one target, with the
fewest engine starts, as one report for people and CI.

``run(target, options, progress=ignore, session=None) -> CertifyReport`` (schema
``certify/2``). It returns a report whatever happens past bad input, so CI always gets
its files (``state`` and ``error`` in the document say what happened):

1. Facts (:mod:`opsctl.checks.certify_plan`): the model's kind (generative, pooling
   cross-/bi-encoder, multimodal, hybrid KV groups) and the target's (a URL or an engine
   certify starts). No vLLM server at the URL (refused, no answer within
   ``min(timeout, 30 s)``, another HTTP server, a refused key) is state "unreachable":
   one failed ``liveness`` case, every other check skipped, exit 3 (:func:`not_reached`).
2. Selection (:func:`opsctl.domain.certify.select`): applicable checks minus
   ``Options.skip`` (or only ``Options.checks``); every other check is "skipped" with
   its reason. A check named in ``Options.checks`` that cannot run is BadInput (exit 2,
   no report: the command line must change).
3. Engines: compatible checks share one engine (``session.plan``; the plan is
   certify_plan's). :class:`CertifySession` keeps at most ONE engine alive: a new start
   first stops the engine before it (checks run grouped by engine, so nothing restarts).
   Every start and the checks it served are in the report; a start that fails is an
   error case of each check it was for (state "start_failed" when none started).
4. Each check runs with the shared session; a check that errs (engine died, timeout, a
   bug: any exception) is "error" and the others still run; one that finds at run time
   it cannot run is "skipped" (with why). An interrupt (Ctrl-C, a stop signal) ends the
   run: what finished is kept, the running check is an "interrupted" error, state
   "interrupted", exit 130 (the caller re-raises ``report.stop`` after writing).
5. The session closes; shutdown hygiene judges the stop reports and rechecks.

Progress: :class:`CheckStarted`, each check's own events wrapped in
:class:`CheckProgress`, :class:`CheckDone` (one case per check) and the summary table.
Formats: opsctl.domain.certify (JSON fields, summary), junit, sarif.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opsctl.checks import certify_plan as planning
from opsctl.checks import events as ev
from opsctl.checks import registry
from opsctl.checks.report import Report
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, Live, Target, UrlTarget
from opsctl.domain import certify as certify_dom
from opsctl.domain import check_registry as reg
from opsctl.errors import BadInput, EngineDied, EngineUnreachable, OpsctlError, OpsTimeout

TITLE = "certify"


@dataclass(frozen=True, slots=True)
class Options:
    """Which checks certify runs (``checks`` or all but ``skip``) and its timeout."""

    checks: tuple[str, ...] = ()  # only these (each must be able to run)
    skip: tuple[str, ...] = ()
    timeout: float = 300.0  # seconds: an engine's start, and any one HTTP answer
    invariance_mode: str = "default"  # execution mode invariance certifies (PR 56528)

    def __post_init__(self) -> None:
        for names, flag in ((self.checks, "--checks"), (self.skip, "--skip")):
            try:
                certify_dom.parse_list(",".join(names), flag)
            except ValueError as exc:
                raise BadInput(str(exc)) from None
        if not self.timeout > 0:
            raise BadInput(f"--timeout must be positive, not {self.timeout}")
        if self.invariance_mode not in ("default", "eager"):
            raise BadInput("invariance_mode must be default or eager")


# ---- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckStarted(ev.Event):
    """A check of certify began (``index`` of ``total``)."""

    check: str
    index: int
    total: int

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: the phase, ``check (index/total)``."""
        return {"phase": f"{self.check} ({self.index}/{self.total})"}


@dataclass(frozen=True, slots=True)
class CheckProgress(ev.Prefixed):
    """An event of the running check, wrapped for certify's panel.

    Every log line is prefixed with the check, its phase too; its warnings are as they are."""

    phase: bool = True

    @property
    def check(self) -> str:
        """The name of the check the event came from."""
        return self.name


@dataclass(frozen=True, slots=True)
class CheckDone(ev.CaseResult):
    """One check finished (``name`` is the check, ``detail`` its first finding)."""

    seconds: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: the check's verdict, time and detail."""
        tail = f": {self.detail}" if self.detail else ""
        return {"events": [f"{self.name} -> {self.verdict} ({self.seconds:.1f} s){tail}"]}


# ---- session ---------------------------------------------------------------------------------


class CertifySession(EngineSession):
    """An engine session with one engine alive at a time, for certify.

    It remembers which check each start served, and does not retry a start that failed."""

    def __init__(self) -> None:
        super().__init__()
        self.current = ""  # the check running now
        self.served: dict[int, list[str]] = {}  # id(EngineStart) -> checks
        self.failed: list[dict[str, Any]] = []  # starts that failed: spec, error
        self._broken: dict[tuple, OpsctlError] = {}

    def engine(self, spec: EngineSpec, progress: ev.Progress = ev.ignore, *, label: str) -> Live:
        """The live engine of ``spec`` (started for ``label``, stopping any other first).

        A start that failed before raises its error again instead of retrying."""
        key = spec.engine_key()
        if key in self._broken:
            raise self._broken[key]
        if key not in self._running:
            for other in list(self._running):  # one engine at a time (2 cores, one lock)
                self._stop(other, progress)
        try:
            live = super().engine(spec, progress, label=label)
        except Exception as exc:
            err = _start_failure(exc)
            self._broken[key] = err
            self.failed.append({"check": self.current, "model": spec.model, "error": err.message})
            raise err from None
        checks = self.served.setdefault(id(self._running[key]), [])
        if self.current not in checks:
            checks.append(self.current)
        return live

    def engines_of(self, check: str) -> tuple[int, ...]:
        """The indexes in ``starts`` of the engines that served ``check``."""
        return tuple(i for i, s in enumerate(self.starts) if check in self.served.get(id(s), ()))


def _start_failure(exc: Exception) -> OpsctlError:
    """An engine certify starts for itself that does not come up fails the checks it was
    for (an error case each), whatever the cause: vLLM rejecting certify's arguments
    (BadInput from the engine, not from the user: never a skip) or an OSError."""
    if isinstance(exc, OpsTimeout | EngineDied):
        return exc
    if isinstance(exc, OpsctlError):
        return EngineDied(f"the engine did not start: {exc.message}", hint=exc.hint)
    return EngineDied(f"the engine did not start: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class CertifyReport(Report):
    """The ``opsctl.certify/2`` document, its verdict and the hint for its error.

    ``hint`` goes with the ``error`` on stderr (e.g. "pass --api-key KEY")."""

    hint: str | None = None
    stop: KeyboardInterrupt | None = None  # interrupted: re-raised once the report is out

    @property
    def results(self) -> list[dict[str, Any]]:
        """One result per check (run, skipped or errored), in the document's order."""
        return list(self.document["checks"])

    @property
    def exit_code(self) -> int:
        """The exit code the document records."""
        return int(self.document["exit_code"])

    @property
    def refused(self) -> list[str]:
        """Checks asked for by name that turned out unable to run (the CLI's exit 2)."""
        return list(self.document["refused"])

    def verdicts(self) -> dict[str, str]:
        """Each check's verdict, by check name."""
        return {r["check"]: r["verdict"] for r in self.results}


# ---- run -------------------------------------------------------------------------------------


def run(
    target: Target,
    options: Options = Options(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> CertifyReport:
    """Certify ``target``: every selected check, engines shared, one report; see the module doc."""
    if session is not None and not isinstance(session, CertifySession):
        raise TypeError("certify needs a CertifySession (or none)")
    own = session if session is not None else CertifySession()
    started = time.monotonic()
    progress(ev.Started(TITLE, f"certifying {_name(target)}"))
    job: _Job | None = None
    try:
        try:
            facts, selection = _select(target, options, own)
            job = _Job(target, options, facts, selection, own, progress)
        except EngineUnreachable as err:  # nothing to certify: one failed liveness case
            return not_reached(target, err, time.monotonic() - started, progress)
        try:
            job.run_checks()
        except KeyboardInterrupt as stop:  # Ctrl-C, a stop signal, the TUI's quit
            job.stop, job.progress = stop, ev.ignore  # the TUI's progress raises once quit
    finally:
        own.close(job.progress if job is not None else progress)
    if job.stop is not None:
        return _report(job, job.interrupted(), time.monotonic() - started)
    return _report(job, job.finish(), time.monotonic() - started)


def not_reached(
    target: Target,
    error: BaseException,
    seconds: float,
    progress: ev.Progress = ev.ignore,
) -> CertifyReport:
    """The report of a certification that never reached its checks.

    No vLLM server answered (``error`` an EngineUnreachable: state unreachable, exit 3),
    or certify itself failed (any other error: state crashed, liveness as an error case,
    exit 1).
    The same document, JUnit and SARIF as any other run, so CI always gets its files."""
    from opsctl.checks.certify_facts import bare_fingerprint

    unreachable = isinstance(error, EngineUnreachable)
    if unreachable:
        message = error.message
    elif isinstance(error, OpsctlError):
        message = f"certify failed before its checks: {error.message}"
    else:
        message = f"internal error: {type(error).__name__}: {error}"
    state = certify_dom.UNREACHABLE if unreachable else certify_dom.CRASHED
    if unreachable and message.startswith("authentication required"):  # collectors.http
        state = certify_dom.UNAUTHORIZED
    results = certify_dom.not_reached(message, seconds, state)
    progress(CheckDone(results[0].check, results[0].verdict, message, seconds))
    rows = summary_rows([r.to_dict() for r in results])
    progress(ev.Table(SUMMARY_COLUMNS, tuple(tuple(r) for r in rows)))
    progress(ev.Finished(certify_dom.overall(results), message))
    report = _document(
        target, results, seconds, state=state, error=message,
        fingerprint=bare_fingerprint(), model_kind=None, engines=[], failed_starts=[],
        refused=[],
    )  # fmt: skip
    return replace(report, hint=getattr(error, "hint", None))


def cut_short(
    target: Target, results: list[certify_dom.CheckResult], seconds: float, state: str, error: str
) -> CertifyReport:
    """The report of a certification stopped from outside before it finished.

    A fleet target past its deadline, or interrupted: ``results`` as far as they are known,
    the fingerprint unknown (null) but opsctl's version."""
    from opsctl.checks.certify_facts import bare_fingerprint

    return _document(
        target, results, seconds, state=state, error=error,
        fingerprint=bare_fingerprint(), model_kind=None, engines=[], failed_starts=[],
        refused=[],
    )  # fmt: skip


def _name(target: Target) -> str:
    return target.url if isinstance(target, UrlTarget) else str(target.model or "default model")


def _select(
    target: Target, options: Options, session: CertifySession
) -> tuple[planning.Facts, certify_dom.Selection]:
    if isinstance(target, UrlTarget):
        facts = planning.url_facts(target, session, options.timeout)
    else:
        facts = planning.managed_facts(target)
    try:
        return facts, certify_dom.select(facts.subject, options.checks, options.skip)
    except ValueError as exc:
        raise BadInput(str(exc), hint="drop it from --checks, or let certify decide") from None


class _Job:
    """One certification: its plan, the running results table and each check's call."""

    def __init__(
        self,
        target: Target,
        options: Options,
        facts: planning.Facts,
        selection: certify_dom.Selection,
        session: CertifySession,
        progress: ev.Progress,
    ) -> None:
        self.target, self.options, self.facts = target, options, facts
        self.selection, self.session, self.progress = selection, session, progress
        managed = isinstance(target, EngineSpec)
        self.settings = planning.certify_options(options, managed)  # each check's options
        self.targets: dict[str, Any] = {c: target for c in selection.run}
        self.refused: list[str] = []
        if isinstance(target, EngineSpec):
            from opsctl.embedded.catalog import DEFAULT_MODEL

            base = replace(target, model=target.model or DEFAULT_MODEL, timeout=options.timeout)
            plan = planning.engine_plan(base, facts, selection.run, self.settings)
            self.targets = plan.targets
            session.plan(plan.specs)
        self.results: dict[str, certify_dom.CheckResult] = {
            c: certify_dom.skipped(c, why) for c, why in selection.skipped.items()
        }
        self.stop: KeyboardInterrupt | None = None  # the run was interrupted
        self.started_at = 0.0  # time.monotonic() when the running check began

    def ordered(self) -> list[certify_dom.CheckResult]:
        return [self.results[c] for c in certify_dom.certify_checks() if c in self.results]

    def table(self) -> None:
        now = [
            (self.results.get(c) or certify_dom.CheckResult(c, "pending")).to_dict()
            for c in certify_dom.certify_checks()
        ]
        rows = [tuple(r) for r in summary_rows(now)]
        self.progress(ev.Table(SUMMARY_COLUMNS, tuple(rows)))

    def _after_engines(self) -> list[str]:
        return [c for c in self.selection.run if reg.get(c).after_engines]

    def run_checks(self) -> None:
        """Every selected check but those run once the engines stopped, in order."""
        self.table()
        later = self._after_engines()
        todo = [c for c in self.selection.run if c not in later]
        for n, check in enumerate(todo, 1):
            self.results[check] = self.run_one(check, n, len(self.selection.run))
            self.table()

    def finish(self) -> list[certify_dom.CheckResult]:
        """After the session closed: the checks that run then (shutdown hygiene)."""
        later = self._after_engines()
        total = len(self.selection.run)
        for n, check in enumerate(later, total - len(later) + 1):
            self.results[check] = self.run_one(check, n, total)
            self.table()
        return self.ordered()

    def interrupted(self) -> list[certify_dom.CheckResult]:
        """After an interrupt: the check that was running is an error case
        ("interrupted"), the checks not reached are skipped, finished ones keep theirs."""
        running = self.session.current
        if running and running not in self.results:
            seconds = time.monotonic() - self.started_at
            self.results[running] = certify_dom.errored(
                running, certify_dom.INTERRUPTED_WHY, seconds, False
            )
        for c in self.selection.run:
            self.results.setdefault(
                c, certify_dom.skipped(c, f"not run: {certify_dom.INTERRUPTED_WHY}")
            )
        return self.ordered()

    def run_one(self, check: str, index: int, total: int) -> certify_dom.CheckResult:
        self.progress(CheckStarted(check, index, total))
        self.session.current = check
        t0 = self.started_at = time.monotonic()

        def scoped(event: ev.Event) -> None:
            self.progress(CheckProgress(check, event))

        try:
            report = self.call(check, scoped)
        except BadInput as err:
            if check in self.options.checks:
                self.refused.append(check)
            result = certify_dom.skipped(check, f"cannot run here: {err.message}")
        except OpsctlError as err:
            result = certify_dom.errored(
                check, err.message, time.monotonic() - t0, isinstance(err, OpsTimeout),
                self.session.engines_of(check),
            )  # fmt: skip
        except Exception as err:  # a bug in one check must not hide the others' results
            message = f"internal error: {type(err).__name__}: {err}"
            result = certify_dom.errored(check, message, time.monotonic() - t0, False)
        else:
            engines = self.session.engines_of(check)
            result = certify_dom.judged(check, report.to_dict(), time.monotonic() - t0, engines)
        self.progress(CheckDone(check, result.verdict, result.headline(), result.seconds))
        return result

    def call(self, check: str, progress: ev.Progress) -> Report:
        """Run ``check`` as its registration says certify runs it."""
        ctx = registry.CertifyContext(
            self.targets[check],
            self.options.timeout,
            self.facts,
            self.session,
            self.settings,
        )
        return registry.certify_run(check, ctx, progress)


def _report(job: _Job, results: list[certify_dom.CheckResult], seconds: float) -> CertifyReport:
    from opsctl.checks.certify_facts import engines, fingerprint

    session, facts = job.session, job.facts
    engine_docs = engines(session)
    state, error = certify_dom.RAN, None
    if job.stop is not None:
        why = str(job.stop)  # Terminated: the signal's name; Ctrl-C: ""
        state, error = certify_dom.INTERRUPTED, f"interrupted by {why}" if why else "interrupted"
    elif session.failed and not session.starts:  # every engine certify needed failed
        state, error = certify_dom.START_FAILED, str(session.failed[0]["error"])
    job.progress(ev.Finished(certify_dom.overall(results), summary_line(results, len(engine_docs))))
    report = _document(
        job.target, results, seconds, state=state, error=error,
        fingerprint=fingerprint(job.target, facts, engine_docs),
        model_kind=facts.subject.kind(), engines=engine_docs, failed_starts=session.failed,
        refused=job.refused,
    )  # fmt: skip
    return replace(report, stop=job.stop) if job.stop is not None else report


def _document(
    target: Target,
    results: list[certify_dom.CheckResult],
    seconds: float,
    *,
    state: str,
    error: str | None,
    fingerprint: dict[str, Any],
    model_kind: dict[str, Any] | None,
    engines: list[dict[str, Any]],
    failed_starts: list[dict[str, Any]],
    refused: list[str],
) -> CertifyReport:
    from opsctl.output import document

    verdict = certify_dom.overall(results)
    url = target.url if isinstance(target, UrlTarget) else None
    doc = document(
        certify_dom.SCHEMA,
        verdict=verdict,
        state=state,
        error=error,
        exit_code=certify_dom.exit_code(results, state),
        target={"kind": "url" if url else "managed", "url": url},
        model_kind=model_kind,
        fingerprint=fingerprint,
        summary={**certify_dom.counts(results), "engine_starts": len(engines)},
        checks=[r.to_dict() for r in results],
        engines=engines,
        failed_starts=failed_starts,
        refused=refused,
        duration_s=round(seconds, 2),
    )
    return CertifyReport(verdict, doc)


# ---- the summary table (live panel and terminal report) ----------------------


SUMMARY_COLUMNS = ("check", "verdict", "time", "first finding")


def summary_rows(checks: Sequence[Mapping[str, Any]], width: int = 72) -> list[list[str]]:
    """The human summary rows from the document's ``checks``.

    Each row: check, verdict, time, first finding (cut to ``width``).
    """
    rows = []
    for c in checks:
        verdict = str(c["verdict"])
        seconds = c.get("duration_s") or 0
        time_cell = "-" if verdict in (certify_dom.SKIPPED, "pending") else f"{seconds:.1f} s"
        text = str(c.get("first_finding") or "-")
        if len(text) > width:
            text = text[: width - 1] + "…"
        rows.append(
            [
                str(c["check"]),
                verdict if verdict in (certify_dom.SKIPPED, "pending") else verdict.upper(),
                time_cell,
                text,
            ]
        )
    return rows


def summary_line(results: Sequence[certify_dom.CheckResult], engine_starts: int) -> str:
    """One line: checks run, passed, failed, errored, skipped and engine starts."""
    c = certify_dom.counts(results)
    return (
        f"{c['run']} check(s) run: {c[certify_dom.PASS]} passed, {c[certify_dom.FAILED]} failed, "
        + (
            f"{c[certify_dom.UNVERIFIED] + c[certify_dom.INCONCLUSIVE]} not judged, "
            if c[certify_dom.UNVERIFIED] + c[certify_dom.INCONCLUSIVE]
            else ""
        )
        + f"{c[certify_dom.ERROR]} errored; {c[certify_dom.SKIPPED]} skipped; {engine_starts} engine start(s)"
    )
