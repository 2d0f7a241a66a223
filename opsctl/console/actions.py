"""What an operator does from the console, as library calls with no UI.

The Textual side is opsctl.console.view_actions: run a check on an endpoint, vLLM admin
calls, reap orphaned engines, a forensics bundle. Servers are started and stopped by
:mod:`opsctl.console.servers`.

Checks: :func:`applicable` says which checks fit an endpoint's model kind (read from
its model directory's config.json, or opsctl's embedded catalog by name; unknown kinds
get every URL check, which refuses a model it does not fit): usage for pooling models,
mm-uuid for multimodal ones, invariance for generative ones, kv-fail only for servers
opsctl started (it starts its own engine with the same model). :class:`Jobs` runs each
check in a worker thread of its own; its typed events become panel snapshots
(``CheckJob.snapshots``) and ``on_event(job, snapshot)`` is called from that thread, so
a UI only renders. A job's result (verdict, first finding) stays in the job.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.checks import events as ev
from opsctl.collectors import jsonfile
from opsctl.console.judge import EndpointView
from opsctl.domain import admin_routes as adm
from opsctl.domain import check_registry as reg
from opsctl.errors import BadInput

# ---- which checks apply ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckChoice:
    """A check the console offers for an endpoint, and why."""

    name: str  # a registered check on the console (the CLI's `diag NAME`)
    why: str  # one line: why it is offered

    @property
    def title(self) -> str:
        """The check's title, as the CLI names it (``diag NAME``)."""
        return f"diag {self.name}"


def run_meta(view: EndpointView) -> dict[str, Any]:
    """meta.json of the opsctl run behind an endpoint ({} when none)."""
    return jsonfile.run_meta(view.target.run_dir)


def model_kind(view: EndpointView, model_path: str | None = None) -> tuple[str | None, str]:
    """(archetype or None, how it is known)."""
    from opsctl.embedded import catalog
    from opsctl.engine.model import archetype_of

    names = [model_path, run_meta(view).get("model_path")]
    names += [m.root for m in view.info.models] + [m.id for m in view.info.models]
    for name in [n for n in names if n]:
        cfg = Path(str(name)) / "config.json"
        try:
            if cfg.is_file():
                return archetype_of(json.loads(cfg.read_text())), f"{cfg}"
        except (OSError, ValueError):
            continue
    for name in [n for n in names if n]:
        if str(name) in catalog.CATALOG:
            return catalog.CATALOG[str(name)].archetype, f"embedded model {name}"
    return None, "its model directory is not readable here"


def applicable(
    view: EndpointView, *, ours: bool = False, model_path: str | None = None
) -> list[CheckChoice]:
    """The registered checks that fit ``view`` (``ours``: this console started it).

    A server of unknown kind is offered every check (each refuses a model it does not fit)."""
    kind, how = model_kind(view, model_path)
    opsctl_started = ours or bool(view.target.run_dir)
    tag = f"{kind} model ({how})" if kind else f"model kind unknown: {how}"
    out = []
    for check in reg.checks(reg.CONSOLE):
        offer = check.offer
        assert offer is not None  # on the console: it has an offer
        if (kind is None or kind in offer.kinds) and (opsctl_started or not offer.opsctl_started):
            out.append(CheckChoice(check.name, f"{offer.why}; {tag}"))
    return out


def choose(view: EndpointView, name: str, **kw) -> CheckChoice:
    """The check ``name`` if it applies to ``view``, else BadInput saying what does."""
    offered = applicable(view, **kw)
    for c in offered:
        if c.name == name:
            return c
    known = reg.names(reg.CONSOLE)
    if name not in known:
        raise BadInput(f"unknown check {name!r}: one of {', '.join(known)}")
    opsctl_only = reg.get(name).offer.opsctl_started  # type: ignore[union-attr]
    why = "only for servers opsctl started" if opsctl_only else "not for this model"
    fits = ", ".join(c.name for c in offered) or "none"
    raise BadInput(f"diag {name} does not apply to {view.target.name} ({why}); it takes: {fits}")


def check_call(
    choice: CheckChoice,
    view: EndpointView,
    api_key: str | None,
    model_path: str | None = None,
) -> Callable[[ev.Progress], Any]:
    """``call(progress) -> report`` running ``choice`` against ``view``'s server."""
    from opsctl.checks import registry
    from opsctl.checks.target import UrlTarget

    meta = run_meta(view)
    server = registry.ServerRef(
        UrlTarget(view.target.url, api_key),
        Path(view.target.run_dir) if view.target.run_dir else None,
        model_path or meta.get("model_path") or meta.get("model"),
    )
    return registry.server_call(choice.name, server)


# ---- running checks ----------------------------------------------------------------------


class Cancelled(KeyboardInterrupt):
    """Raised inside a check at its next event once its job is cancelled."""


def first_finding(doc: dict[str, Any]) -> str | None:
    """The line a report leads with.

    Its first failed finding (else warning, else any), or its first reason."""
    findings = [f for f in doc.get("findings") or [] if isinstance(f, dict)]
    for severity in ("fail", "warning", None):
        for f in findings:
            if severity is None or f.get("severity") == severity:
                return str(f.get("message") or f.get("code") or "")
    reasons = doc.get("reasons") or []
    return str(reasons[0]) if reasons else None


@dataclass
class CheckJob:
    """One check running (or run) on an endpoint from the console: its state and panel."""

    id: int
    check: CheckChoice
    url: str
    endpoint: str  # the endpoint's name
    started_at: float = field(default_factory=time.time)
    state: str = "running"  # running | done | error | cancelled
    phase: str = "starting"
    verdict: str | None = None
    finding: str | None = None
    error: str | None = None
    finished_at: float | None = None
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    report: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """True while the job's state is running."""
        return self.state == "running"

    def note(self) -> str:
        """The endpoint row's text for this job."""
        if self.state == "running":
            return f"{self.check.name}: {self.phase}"
        if self.state == "error":
            return f"{self.check.name}: ERROR {self.error or ''}"[:120]
        if self.state == "cancelled":
            return f"{self.check.name}: cancelled"
        tail = f" ({self.finding})" if self.finding else ""
        return f"{self.check.name}: {(self.verdict or '?').upper()}{tail}"[:120]


OnEvent = Callable[[CheckJob, dict[str, Any]], None]


class Jobs:
    """Checks running (and run) from the console, each in its own thread."""

    def __init__(self, on_event: OnEvent | None = None) -> None:
        self.on_event = on_event or (lambda job, snap: None)
        self.jobs: list[CheckJob] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(
        self, choice: CheckChoice, view: EndpointView, call: Callable[[ev.Progress], Any]
    ) -> CheckJob:
        """Run ``call`` for ``choice`` on ``view``'s endpoint in a thread of its own."""
        job = CheckJob(next(self._ids), choice, view.target.url, view.target.name)
        with self._lock:
            self.jobs.append(job)
        job.thread = threading.Thread(
            target=self._run, args=(job, call), name=f"check-{job.id}-{choice.name}", daemon=True
        )
        job.thread.start()
        return job

    def _emit(self, job: CheckJob, snap: dict[str, Any]) -> None:
        with self._lock:
            job.snapshots.append(snap)
            job.phase = str(snap.get("phase") or job.phase)
        self.on_event(job, snap)

    def _run(self, job: CheckJob, call: Callable[[ev.Progress], Any]) -> None:
        def progress(event: ev.Event) -> None:
            if job.cancelled.is_set():
                raise Cancelled()
            snap = event.snapshot()
            if snap:
                self._emit(job, snap)

        try:
            report = call(progress)
            job.report = report
            job.verdict = report.verdict
            job.finding = first_finding(report.to_dict())
            job.state = "done"
            final = {"phase": "done", "verdict": report.verdict}
        except Cancelled:
            job.state = "cancelled"
            final = {"phase": "cancelled", "events": ["cancelled"]}
        except BaseException as exc:  # shown on the row and in the panel, never raised
            job.error = str(exc) or type(exc).__name__
            hint = getattr(exc, "hint", None)
            job.state = "error"
            lines = [f"error: {job.error}", *([f"hint: {hint}"] if hint else [])]
            final = {"phase": "error", "verdict": "fail", "events": lines}
        job.finished_at = time.time()
        self._emit(job, final)

    def for_url(self, url: str) -> list[CheckJob]:
        """The jobs run on the server at ``url``, oldest first."""
        with self._lock:
            return [j for j in self.jobs if j.url == url]

    def notes(self) -> dict[str, str]:
        """Per endpoint URL: its running checks, else its last check's result."""
        out: dict[str, str] = {}
        with self._lock:
            jobs = list(self.jobs)
        for url in {j.url for j in jobs}:
            mine = [j for j in jobs if j.url == url]
            running = [j for j in mine if j.running]
            if len(running) > 1:
                out[url] = f"{len(running)} checks running"
            else:
                out[url] = (running or mine)[-1].note()
        return out

    def cancel_all(self) -> None:
        """Ask every job to stop (each checks its ``cancelled`` flag)."""
        for j in self.jobs:
            j.cancelled.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every job; True when none still runs."""
        deadline = time.monotonic() + timeout
        for j in list(self.jobs):
            if j.thread is not None:
                j.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(j.running for j in self.jobs)


# ---- admin calls, reap, bundle -----------------------------------------------------------


def admin(view: EndpointView, name: str, api_key: str | None, timeout: float = 10.0) -> adm.Outcome:
    """Call the admin route ``name`` on ``view``'s server -> domain Outcome."""
    from opsctl.collectors import admin as admin_col

    r = adm.route(name)
    answer = admin_col.call(view.target.url, r.method, r.path, api_key, timeout)
    return adm.outcome(r, answer.status, answer.body, answer.error, view.info.version)


def reap_plan(runs_dir: Path | None = None) -> list[dict[str, Any]]:
    """Runs ``runs clean`` would reap now (a dry run: nothing is touched)."""
    from opsctl.checks import runs

    opts = runs.CleanOptions(older_than=float("inf"), runs_dir=runs_dir)
    return [r for r in runs.clean(opts).to_dict()["runs"] if r["action"] == "reap"]


def reap(runs_dir: Path | None = None, older_than: float = float("inf")):
    """``runs clean --yes``: reap orphaned engines.

    Finished runs are pruned only when ``older_than`` is finite (the console's default reaps
    and prunes nothing else)."""
    from opsctl.checks import runs

    return runs.clean(runs.CleanOptions(older_than=older_than, yes=True, runs_dir=runs_dir))


def bundle(view: EndpointView, api_key: str | None, out: Path | None = None):
    """``runs bundle`` of the endpoint's run, with the console's last view of it."""
    from opsctl.checks import bundle as check
    from opsctl.console.report import endpoint_dict

    if not view.target.run_dir:
        raise BadInput(f"{view.target.name} is not an opsctl run: a bundle needs a run directory")
    opts = check.Options(
        run=view.target.run_dir,
        out=out,
        api_key=api_key,
        console_view=endpoint_dict(view, time.time()),
    )
    return check.bundle(opts)
