"""The verdict over a server's stacks (pure): which rank is stuck, which ranks wait for it.

``opsctl stacks`` takes every process's stacks twice, ``interval`` apart
(:func:`settle` keeps the second take and marks whether each main thread moved and
whether it slept at both takes). :func:`diagnose` sorts each vLLM process (a role of
:mod:`opsctl.domain.ranks`: API server, coordinator, EngineCore, Worker; helpers such as
the resource tracker or a compiler do not count) into one status:

- ``stopped``: the kernel says so (SIGSTOP, a debugger); stacks or not, it is stuck;
- ``collective``: its main thread stayed in a collective (an all-reduce...) across both
  takes: it waits for a peer;
- ``idle``: it waits where a healthy idle engine waits (between requests);
- ``stuck`` (:data:`STUCK`, also the verdict's word): its main thread stayed at one frame outside those waits, asleep at both takes
  (blocked on a lock, a queue, a sleep: not computing);
- ``busy``: anything else (its stack moved, it computes, or it waits for a child process it
  runs: a compile);
- ``unread``: its stacks could not be read (the reason is its ``error``).

The verdict: ``stuck`` when a process is stopped or stuck, or when ranks wait in a
collective for a peer that is neither busy nor among these processes (on another host:
merge the hosts' reports); ``fail`` when no stack could be read; ``incomplete`` when some
could not be and nothing is stuck; else ``pass``. The headline is one line: the culprits
first (``Worker_TP1 (pid 12) stuck: in planted_hang (...)`` or ``... [stopped]: ...``),
then the ranks that wait for them, grouped by the frame they wait in (``Worker_TP0 (pid
11) waits in all_reduce (...) (collective) under forward (...)``).

:func:`merge` does the same over the reports of several hosts (ranks keyed by host and
role), for servers whose ranks span machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from opsctl.domain import ranks
from opsctl.domain.records import record
from opsctl.stacks.judge import SCHEMA, ProcessStacks, collective, is_idle, where

PASS, STUCK, INCOMPLETE, FAIL = "pass", "stuck", "incomplete", "fail"
VERDICTS = (PASS, STUCK, INCOMPLETE, FAIL)
STOPPED, COLLECTIVE, IDLE, BUSY, UNREAD, HELPER = (
    "stopped",
    "collective",
    "idle",
    "busy",
    "unread",
    "helper",
)
ASLEEP = ("sleeping", "disk-sleep")  # kernel states of a thread that waits, not computes
# a main thread waiting for a child process it runs (torch compiling a kernel with g++ on
# a worker's first requests of a shape: seen for seconds on vLLM 0.32 CPU) works
CHILD_WAITS = ("/subprocess.py",)
DOCUMENT = "opsctl." + SCHEMA  # the schema a report to merge carries


def is_rank(role: str) -> bool:
    """Whether ``role`` is a vLLM process (API server, coordinator, EngineCore, Worker)."""
    return ranks.parse_title(role) is not None


def kind_of(role: str) -> str:
    """The kind of a role (``Worker`` for ``Worker_TP1``): peers are of one kind."""
    rank = ranks.parse_title(role)
    return rank.kind if rank is not None else role


def settle(first: Sequence[ProcessStacks], second: Sequence[ProcessStacks]) -> list[ProcessStacks]:
    """The second take, each process marked ``moved`` and ``asleep`` against the first.

    ``moved``: its main thread's stack differs between the takes (None when either take
    has none); ``asleep``: its main thread slept at both takes (None when unknown)."""
    before = {p.pid: p for p in first}
    out = []
    for p in second:
        q = before.get(p.pid)
        moved = asleep = None
        if q is not None:
            a, b = q.main, p.main
            if a is not None and b is not None and a.frames and b.frames:
                moved = a.key() != b.key()
            if q.state and p.state:
                asleep = q.state in ASLEEP and p.state in ASLEEP
        out.append(replace(p, moved=moved, asleep=asleep))
    return out


def status(p: ProcessStacks) -> str:
    """What one process's stacks show: one of the statuses of the module doc."""
    if p.state == "stopped":
        return STOPPED
    main = p.main
    if main is None or not main.frames:
        return UNREAD if is_rank(p.role) else HELPER
    if not is_rank(p.role):
        return HELPER
    if collective(main.frames) is not None and p.moved is False:
        return COLLECTIVE
    if is_idle(where(main.frames)):
        return IDLE
    if p.moved is False and p.asleep and not any(w in main.frames[0].file for w in CHILD_WAITS):
        return STUCK
    return BUSY


@dataclass(frozen=True, slots=True)
class Finding:
    """One process the verdict names: where it is, its status and its line."""

    host: str | None
    role: str
    pid: int
    status: str
    line: str  # what it does, without its name: "in planted_hang (...)" or why unread

    def to_dict(self) -> dict:
        """The finding as the ``stacks`` document holds it."""
        return record(self)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The verdict over a server's stacks: culprits, who waits for them, what was not read."""

    verdict: str  # one of VERDICTS
    headline: str
    culprits: tuple[Finding, ...] = ()
    waiting: tuple[Finding, ...] = ()
    unread: tuple[Finding, ...] = ()

    def fields(self) -> dict:
        """The document's fields of this diagnosis."""
        return {
            "verdict": self.verdict,
            "headline": self.headline,
            "culprits": [f.to_dict() for f in self.culprits],
            "waiting": [f.to_dict() for f in self.waiting],
            "unread": [f.to_dict() for f in self.unread],
        }


def _what(p: ProcessStacks) -> str:
    """What the process does, as its line says it (without its name)."""
    if p.error:
        return p.error
    main = p.main
    return where(main.frames) if main is not None and main.frames else "no stack"


def _finding(p: ProcessStacks, st: str) -> Finding:
    return Finding(p.host, p.role, p.pid, st, _what(p))


def _name(f: Finding, hosts: bool) -> str:
    who = f"{f.host}/{f.role}" if hosts and f.host else f.role
    return f"{who} (pid {f.pid})"


def _culprit_line(f: Finding, hosts: bool) -> str:
    if f.status == STOPPED:
        return f"{_name(f, hosts)} [stopped]: {f.line}"
    return f"{_name(f, hosts)} stuck: {f.line}"


def _waiting_line(found: Sequence[Finding], hosts: bool) -> str:
    """The waiting ranks, grouped by the frame they wait in (one clause per frame)."""
    by_line: dict[str, list[Finding]] = {}
    for f in found:
        by_line.setdefault(f.line, []).append(f)
    clauses = []
    for line, who in by_line.items():
        names = ", ".join(_name(f, hosts) for f in who)
        verb = line if len(who) == 1 else line.replace("waits in", "wait in", 1)
        clauses.append(f"{names} {verb}")
    return "; ".join(clauses)


def _order(found: Iterable[Finding]) -> list[Finding]:
    return sorted(found, key=lambda f: (ranks.order_key(f.role), f.host or "", f.pid))


def diagnose(processes: Sequence[ProcessStacks]) -> Diagnosis:
    """The verdict and headline over every process of one server (one host or several)."""
    hosts = len({p.host for p in processes}) > 1
    found = [_finding(p, status(p)) for p in processes]
    by = {s: _order(f for f in found if f.status == s) for s in (STOPPED, STUCK, COLLECTIVE)}
    unread = tuple(_order(f for f in found if f.status == UNREAD))
    busy_kinds = {kind_of(f.role) for f in found if f.status == BUSY}
    culprits = by[STOPPED] + by[STUCK]
    waiting = by[COLLECTIVE]
    tail = f" (stacks of {len(unread)} process(es) not read)" if unread else ""
    if culprits:
        head = "; ".join(_culprit_line(f, hosts) for f in culprits)
        if waiting:
            head += "; " + _waiting_line(waiting, hosts)
        return Diagnosis(STUCK, head + tail, tuple(culprits), tuple(waiting), unread)
    held = [f for f in waiting if kind_of(f.role) not in busy_kinds]
    if held:
        head = (
            _waiting_line(held, hosts) + ": the rank they wait for is not among these "
            "processes (another host's? merge the hosts' reports: opsctl stacks --merge)"
        )
        return Diagnosis(STUCK, head + tail, (), tuple(held), unread)
    return _no_culprit(processes, found, waiting, unread, hosts)


def _no_culprit(
    processes: Sequence[ProcessStacks],
    found: Sequence[Finding],
    waiting: Sequence[Finding],
    unread: tuple[Finding, ...],
    hosts: bool,
) -> Diagnosis:
    """The verdict when nothing is stopped or stuck: pass, incomplete or fail."""
    counted = [f for f in found if f.status != HELPER]
    if unread and len(unread) == len(counted):
        lines = "; ".join(f"{_name(f, hosts)}: {f.line}" for f in unread)
        return Diagnosis(FAIL, f"no stacks could be read: {lines}", (), (), unread)
    if unread:
        lines = "; ".join(f"{_name(f, hosts)}: {f.line}" for f in unread)
        return Diagnosis(
            INCOMPLETE,
            f"not every process could be read, so nothing is cleared: {lines}",
            (),
            tuple(waiting),
            unread,
        )
    busy = [f for f in _order(found) if f.status == BUSY]
    if busy:
        line = f"working: {_name(busy[0], hosts)} {busy[0].line}"
        if waiting:
            line += "; " + _waiting_line(waiting, hosts)
        return Diagnosis(PASS, line, (), tuple(waiting), ())
    first = next((f for f in _order(found) if f.status == IDLE), None)
    if first is None:
        return Diagnosis(PASS, "no vLLM process among these", (), (), ())
    line = f"every process waits where an idle engine waits: {_name(first, hosts)}: {first.line}"
    return Diagnosis(PASS, line, (), (), ())


def headline_of(processes: Sequence[dict]) -> str:
    """The one-line verdict over a ``stacks`` document's processes (dicts)."""
    return diagnose([ProcessStacks.from_dict(p) for p in processes]).headline


def merge(reports: Sequence[tuple[str, dict]]) -> tuple[list[ProcessStacks], list[dict]]:
    """The processes of several hosts' ``stacks`` documents, keyed by host and role.

    ``reports``: (name, document) pairs, each an ``opsctl stacks --json`` of one host.
    Returns (every process with its host, one summary per report). ValueError with one
    line when a document is not such a report, or two hold the same host's same role
    (the same report twice, or hosts of one name: give each its own with ``--host``)."""
    seen: dict[tuple[str, str], str] = {}
    out: list[ProcessStacks] = []
    summaries = []
    for name, doc in reports:
        if not isinstance(doc, dict) or doc.get("schema") != DOCUMENT:
            got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{name} is not an {DOCUMENT} report (schema {got!r})")
        host = str(doc.get("host") or "?")
        for d in doc.get("processes") or ():
            p = ProcessStacks.from_dict(d, host)
            p = replace(p, host=host)
            key = (host, p.role)
            if key in seen and is_rank(p.role):
                raise ValueError(
                    f"{seen[key]} and {name} both hold {host}'s {p.role}: the same host twice "
                    "(give each host its own name: opsctl stacks --host NAME)"
                )
            seen[key] = name
            out.append(p)
        summaries.append(
            {
                "file": name,
                "host": host,
                "target": doc.get("target"),
                "pid": doc.get("pid"),
                "taken_at": doc.get("taken_at"),
                "verdict": doc.get("verdict"),
                "headline": doc.get("headline"),
            }
        )
    return out, summaries
