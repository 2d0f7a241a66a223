"""certify over a fleet as a library call: every target's URL checks, bounded, at once.

The checks are those of ``opsctl certify URL``; each target has its own deadline.

``resolve(listed, api_key, environ) -> [FleetTarget]`` turns the targets file's and the
command line's targets (:class:`opsctl.console.judge.Target`) into the fleet: a name
given twice, one server listed twice or an ``api_key_env`` variable that is not set is
BadInput (exit 2, before anything runs or is written).

``run(targets, options, progress=ignore) -> FleetReport`` (schema
``opsctl.certify.fleet/1``): at most ``options.concurrency`` targets are certified at
once, each in its own thread by :func:`opsctl.checks.certify.run` (which returns a
report whatever happens: a dead target is its failed ``liveness`` case). A target whose
certification is not done ``options.timeout`` seconds after it began is concluded there
(state ``deadline``: what finished is kept, liveness fails when it had not passed, the
running check is a timed-out error): its thread is left to end on its own HTTP timeouts
(no engine is started for a URL, so nothing else is left running) and its slot goes to
the next target, so one slow or hung target never holds the others back. The fleet's
wall time is the slowest target's (at most the deadline), not the sum.

Progress: :class:`TargetStarted`, each target's certify events wrapped in
:class:`TargetProgress`, :class:`TargetDone`, the fleet table (``ev.Table``) after
every target and ``ev.Finished``. Events are delivered one at a time (a lock), from
the target threads and the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opsctl.checks import certify
from opsctl.checks import events as ev
from opsctl.checks.report import Report
from opsctl.checks.target import UrlTarget
from opsctl.domain import certify as certify_dom
from opsctl.domain import certify_fleet as fdom
from opsctl.domain.certify_fleet import FleetTarget
from opsctl.errors import BadInput

TITLE = "certify"


@dataclass(frozen=True, slots=True)
class Options:
    """Each target's certify options (its timeout is the deadline) and the concurrency."""

    certify: certify.Options = field(default_factory=certify.Options)  # timeout: the deadline
    concurrency: int = fdom.DEFAULT_CONCURRENCY

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise BadInput(f"--concurrency must be 1 or more, not {self.concurrency}")


def _server(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host in ("localhost", "0.0.0.0", "::", "::1"):
        host = "127.0.0.1"
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def resolve(
    listed: Sequence[Any], api_key: str | None, environ: Mapping[str, str]
) -> list[FleetTarget]:
    """The fleet from console targets (name, url, labels, api_key_env).

    Each name and each server once; a target's key from its ``api_key_env`` variable,
    else ``api_key``."""
    if not listed:
        raise BadInput("no targets to certify", hint="give URLs or --targets FILE")
    name = fdom.duplicate([t.name for t in listed])
    if name is not None:
        raise BadInput(f"target name {name!r} is given twice; each target needs its own name")
    servers = [_server(t.url) for t in listed]
    twice = fdom.duplicate([f"{h}:{p}" for h, p in servers])
    if twice is not None:
        names = [t.name for t, s in zip(listed, servers, strict=True) if f"{s[0]}:{s[1]}" == twice]
        raise BadInput(f"targets {' and '.join(names)} are the same server ({twice})")
    out = []
    for t in listed:
        key = api_key
        if t.api_key_env:
            key = environ.get(t.api_key_env) or None
            if key is None:
                raise BadInput(
                    f"target {t.name!r}: its api_key_env variable {t.api_key_env} is not set",
                    hint=f"export {t.api_key_env}=KEY, or drop api_key_env from the targets file",
                )
        out.append(FleetTarget(t.name, t.url, tuple(t.labels), key))
    return out


# ---- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetStarted(ev.Event):
    """A target's certification began (``index`` of ``total``)."""

    name: str
    url: str
    index: int
    total: int

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: the target being certified."""
        return {"events": [f"[{self.name}] certifying {self.url} ({self.index}/{self.total})"]}


@dataclass(frozen=True, slots=True)
class TargetProgress(ev.Prefixed):
    """An event of one target's certification, wrapped for the fleet panel.

    Only its checks' verdicts and its alerts are log lines, prefixed with the target, and
    so are its warnings."""

    lines_of: tuple[type[ev.Event], ...] = (certify.CheckDone, ev.Alert)
    tag_warnings: bool = True


@dataclass(frozen=True, slots=True)
class TargetDone(ev.CaseResult):
    """One target concluded (``name`` the target, ``verdict`` its certify verdict)."""

    state: str = certify_dom.RAN
    seconds: float = 0.0

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: the target's verdict, state and time."""
        tail = f": {self.detail}" if self.detail else ""
        line = f"[{self.name}] -> {self.verdict} ({self.state}, {self.seconds:.1f} s){tail}"
        return {"events": [line]}


# ---- run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetReport(Report):
    """``document`` is the ``opsctl.certify.fleet/1`` document."""

    stop: KeyboardInterrupt | None = None

    @property
    def exit_code(self) -> int:
        """The exit code the fleet document records."""
        return int(self.document["exit_code"])

    def docs(self) -> list[dict[str, Any]]:
        """Each target's part (its certify document, with name and labels)."""
        return [dict(t) for t in self.to_dict()["targets"]]


@dataclass
class _Slot:
    target: FleetTarget
    index: int
    started: float = 0.0
    running: str | None = None
    done: dict[str, fdom.Done] = field(default_factory=dict)
    report: certify.CertifyReport | None = None
    concluded: dict[str, Any] | None = None  # its entry in the fleet document


class _Fleet:
    def __init__(self, targets: Sequence[FleetTarget], options: Options, progress: ev.Progress):
        self.options, self.outer = options, progress
        self.slots = [_Slot(t, i) for i, t in enumerate(targets, 1)]
        self.cond = threading.Condition()
        self.deadline = options.certify.timeout

    def emit(self, event: ev.Event) -> None:  # called with self.cond held
        self.outer(event)

    def work(self, slot: _Slot) -> None:
        url = UrlTarget(slot.target.url, slot.target.api_key)

        def progress(event: ev.Event) -> None:
            with self.cond:
                if slot.concluded is not None:
                    return  # past its deadline: the fleet moved on
                if isinstance(event, certify.CheckStarted):
                    slot.running = event.check
                elif isinstance(event, certify.CheckDone):
                    slot.done[event.name] = fdom.Done(event.verdict, event.detail, event.seconds)
                self.emit(TargetProgress(slot.target.name, event))

        try:
            report = certify.run(url, self.options.certify, progress)
        except BaseException as exc:  # e.g. --checks naming a check it cannot run here
            report = certify.not_reached(url, exc, time.monotonic() - slot.started)
        with self.cond:
            slot.report = report
            self.cond.notify_all()

    def conclude(self, slot: _Slot, state: str | None = None) -> None:
        """``slot``'s entry: its report, or (``state`` deadline/interrupted) what is known."""
        seconds = time.monotonic() - slot.started if slot.started else 0.0
        if state is None and slot.report is not None:
            doc = slot.report.to_dict()
        else:
            state = state or fdom.INTERRUPTED
            doc = self.cut(slot, state, seconds)
        slot.concluded = fdom.entry(slot.target, doc)
        first = first_failure(slot.concluded)
        self.emit(
            TargetDone(slot.target.name, doc["verdict"], "" if first == "-" else first,
                       str(doc["state"]), float(doc["duration_s"]))
        )  # fmt: skip
        self.table()

    def cut(self, slot: _Slot, state: str, seconds: float) -> dict[str, Any]:
        url = UrlTarget(slot.target.url, slot.target.api_key)
        if state == fdom.DEADLINE:
            why = f"no answer within the target's deadline ({self.deadline:g} s, --timeout)"
            results = fdom.deadline_results(slot.done, slot.running, seconds, why, True)
        else:
            why = certify_dom.INTERRUPTED_WHY
            results = fdom.deadline_results(slot.done, slot.running, seconds, why, False)
        return certify.cut_short(url, results, seconds, state, why).to_dict()

    def table(self) -> None:
        entries = [s.concluded for s in self.slots if s.concluded is not None]
        rows = summary_rows(entries)
        waiting = [[s.target.name, s.target.url, "…", "running" if s.started else "queued",
                    "-", "-"] for s in self.slots if s.concluded is None]  # fmt: skip
        self.emit(ev.Table(FLEET_COLUMNS, tuple(tuple(r) for r in rows + waiting)))

    def run(self) -> list[dict[str, Any]]:
        queue, active = list(self.slots), []
        with self.cond:
            while queue or active:
                while queue and len(active) < self.options.concurrency:
                    slot = queue.pop(0)
                    slot.started = time.monotonic()
                    self.emit(TargetStarted(slot.target.name, slot.target.url, slot.index,
                                            len(self.slots)))  # fmt: skip
                    threading.Thread(
                        target=self.work, args=(slot,), daemon=True,
                        name=f"certify-{slot.target.name}",
                    ).start()  # fmt: skip
                    active.append(slot)
                now = time.monotonic()
                for slot in list(active):
                    if slot.report is not None:
                        self.conclude(slot)
                    elif now >= slot.started + self.deadline:
                        self.conclude(slot, fdom.DEADLINE)
                    else:
                        continue
                    active.remove(slot)
                if active and not (queue and len(active) < self.options.concurrency):
                    soonest = min(s.started for s in active) + self.deadline
                    self.cond.wait(timeout=max(0.0, soonest - time.monotonic()))
        return [s.concluded for s in self.slots if s.concluded is not None]

    def interrupted(self) -> list[dict[str, Any]]:
        with self.cond:
            for slot in self.slots:
                if slot.concluded is None:
                    self.outer = ev.ignore  # the TUI's progress raises once quit
                    self.conclude(slot, fdom.INTERRUPTED)
            return [s.concluded for s in self.slots if s.concluded is not None]


def run(
    targets: Sequence[FleetTarget], options: Options = Options(), progress: ev.Progress = ev.ignore
) -> FleetReport:
    """Certify every target, at most ``concurrency`` at once; see the module doc."""
    started = time.monotonic()
    fleet = _Fleet(targets, options, progress)
    progress(ev.Started(TITLE, f"certifying {len(targets)} target(s)"))
    stop: KeyboardInterrupt | None = None
    try:
        entries = fleet.run()
    except KeyboardInterrupt as exc:  # Ctrl-C, a stop signal, the TUI's quit
        stop, entries = exc, fleet.interrupted()
    from opsctl.output import document

    fields = fdom.fleet_fields(entries, stop is not None)
    doc = document(
        fdom.SCHEMA,
        **fields,
        concurrency=options.concurrency,
        timeout_s=options.certify.timeout,
        duration_s=round(time.monotonic() - started, 2),
        targets=entries,
    )
    if stop is None:
        s = fields["summary"]
        line = f"{s['targets']} target(s): {s['passed']} passed, {s['failed']} failed"
        progress(ev.Finished(fields["verdict"], line))
    return FleetReport(fields["verdict"], doc, stop)


# ---- the fleet table (live panel and terminal report) ------------------------


FLEET_COLUMNS = ("target", "url", "verdict", "state", "time", "first failure")


def first_failure(entry: Mapping[str, Any]) -> str:
    """The target's first failure for a human line: its error, or a failing check's finding."""
    if entry.get("error"):
        return str(entry["error"])
    for c in entry.get("checks") or ():
        if c.get("verdict") in (certify_dom.FAILED, certify_dom.ERROR):
            return f"{c['check']}: {c.get('first_finding') or c['verdict']}"
    return "-"


def summary_rows(entries: Sequence[Mapping[str, Any]], width: int = 60) -> list[list[str]]:
    """The fleet summary table's rows: name, URL, verdict, state, time, first failure."""
    rows = []
    for e in entries:
        text = first_failure(e)
        if len(text) > width:
            text = text[: width - 1] + "…"
        url = (e.get("target") or {}).get("url") or "-"
        seconds = float(e.get("duration_s") or 0)
        verdict = str(e.get("verdict") or "?").upper()
        rows.append([str(e["name"]), url, verdict, str(e.get("state")), f"{seconds:.1f} s", text])
    return rows
