"""The rank that died first (pure): exit records, roles and the log -> a :class:`FirstDeath`.

When one rank of a vLLM server dies, vLLM tears the rest down or leaves it half alive
(measured on 0.32, CPU): a SIGKILLed ``Worker_TP1`` makes its EngineCore stop the other
worker (SIGTERM after 5 s, SIGKILL 4 s later) and die, unless the API server, failing
the requests in flight (HTTP 500), stops it first; the API server exits with code 0
0.9 to 10 s after the kill (both seen). A SIGKILLed ``EngineCore_DP1`` makes the API
server stop ``EngineCore_DP0`` and exit (code 0) 5 to 8 s later; the dead engine's
worker may outlive it a moment. A SIGKILLed ``DPCoordinator`` changes nothing visible: the server keeps serving.
vLLM's own log then names nobody (the API server's exit code is 0).

What opsctl knows, and this module judges:

- ``exits``: what vLLM's processes saw of their children (``<run>/exits.jsonl``, written
  by ``engine_patches.exits``): pid, process name, exit code (negative: a signal), time;
- ``gone``: when opsctl saw a process of the server disappear (its own tracking);
- the API server's exit code (opsctl's wait) and when it was seen;
- ``roles``: pid -> rank role (``Worker_TP1``), from the ledger's titles, opsctl's
  tracking or the log's ``(ROLE pid=N)`` prefixes;
- the log, for the last lines the first dead rank wrote.

Only rank processes (API server, coordinator, EngineCores, workers) count; only ends
before ``before`` (the moment opsctl began stopping the server) count.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opsctl.domain import ranks

OOM_OR_KILL = "an out-of-memory kill or kill -9"
_PREFIX = re.compile(r"^\((\w+) pid=(\d+)\)\s?(.*)$")
# multiprocessing names vLLM gives its children, for a pid no title is known of
_NAMES = (
    (re.compile(r"^VllmWorker-(\d+)$"), lambda m: f"{ranks.WORKER} (local rank {m.group(1)})"),
    (re.compile(r"^VLLM_DP_Coordinator$"), lambda m: ranks.COORDINATOR),
)


@dataclass(frozen=True, slots=True)
class End:
    """One process of the server that ended: when, how (exit code) and who saw it."""

    pid: int
    time: float
    exitcode: int | None  # None: not seen (the process is gone, nobody waited on it)
    source: str  # "parent" (its vLLM parent), "opsctl" (the API server's wait), "seen gone"
    name: str = ""  # multiprocessing's name of the process (exit records)


@dataclass(frozen=True, slots=True)
class Fate:
    """What one other rank did after the first death."""

    pid: int
    role: str
    # "exited", "gone" (exit code not seen), "alive", or "stopped" (it still ran when
    # opsctl began stopping the server: read after that stop)
    fate: str
    exitcode: int | None = None
    after_s: float | None = None  # seconds after the first death

    def describe(self) -> str:
        """``EngineCore (pid 7) terminated by SIGTERM (exit code -15) +9.4 s``."""
        who = f"{self.role} (pid {self.pid})"
        if self.fate == "alive":
            return f"{who} still alive"
        if self.fate == "stopped":
            return f"{who} ended by opsctl's stop +{self.after_s or 0:.1f} s"
        when = f" +{self.after_s:.1f} s" if self.after_s is not None else ""
        return f"{who} {how_it_ended(self.exitcode, short=True)}{when}"

    def to_dict(self) -> dict:
        """The fate as a JSON object."""
        return {
            "pid": self.pid,
            "role": self.role,
            "fate": self.fate,
            "exitcode": self.exitcode,
            "signal": signal_name(self.exitcode),
            "after_s": self.after_s,
        }


@dataclass(frozen=True, slots=True)
class FirstDeath:
    """The rank that died first, how, its last log lines, and what the others did."""

    pid: int
    role: str
    exitcode: int | None
    at: float  # when it was seen ended (epoch seconds)
    seen_by: str  # End.source
    last_lines: tuple[str, ...]
    others: tuple[Fate, ...]
    server_up: bool  # the API server still runs
    serving: bool | None = None  # it still answers /health 200 (None: not asked)

    @property
    def signal(self) -> str | None:
        """The signal that ended it (``SIGKILL``); None for an exit code or unknown."""
        return signal_name(self.exitcode)

    @property
    def cause(self) -> str:
        """``killed by SIGKILL (exit code -9: an out-of-memory kill or kill -9)``."""
        return how_it_ended(self.exitcode)

    def summary(self) -> str:
        """One line: who died first, how, and what the other ranks did."""
        head = f"{self.role} (pid {self.pid}) died first: {self.cause}"
        ended = [f for f in self.others if f.fate not in ("alive", "stopped")]
        stopped = [f for f in self.others if f.fate == "stopped"]
        alive = [f for f in self.others if f.fate == "alive"]
        parts = [head]
        if ended:
            parts.append("then " + ", ".join(f.describe() for f in ended))
        if alive:
            tail = ", ".join(f"{f.role} (pid {f.pid})" for f in alive)
            parts.append(f"still alive: {tail}{self._alive_note()}")
        if stopped:
            tail = ", ".join(f"{f.role} (pid {f.pid})" for f in stopped)
            parts.append(f"ended by opsctl's stop +{stopped[0].after_s or 0:.1f} s: {tail}")
        return "; ".join(parts)

    def _alive_note(self) -> str:
        if not self.server_up:
            return ""
        if self.serving is True:
            return " (the API server still answers /health 200)"
        if self.serving is False:
            return " (the API server does not answer /health)"
        return ""

    def lines(self) -> tuple[str, ...]:
        """The summary, then the last lines the first dead rank logged."""
        if not self.last_lines:
            return (self.summary(), f"{self.role} logged nothing opsctl could find")
        return (
            self.summary(),
            f"last lines of {self.role} (pid {self.pid}):",
            *(f"  {line}" for line in self.last_lines),
        )

    def to_dict(self) -> dict:
        """The verdict as a JSON object (serve's stopped event, the bundle)."""
        return {
            "pid": self.pid,
            "role": self.role,
            "exitcode": self.exitcode,
            "signal": self.signal,
            "cause": self.cause,
            "at": self.at,
            "seen_by": self.seen_by,
            "last_lines": list(self.last_lines),
            "others": [f.to_dict() for f in self.others],
            "server_up": self.server_up,
            "serving": self.serving,
            "summary": self.summary(),
        }


def signal_name(exitcode: int | None) -> str | None:
    """``SIGKILL`` for exit code -9 (multiprocessing's and Popen's way); None otherwise."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def how_it_ended(exitcode: int | None, short: bool = False) -> str:
    """How a process ended, in words, from its exit code (``short``: no SIGKILL gloss)."""
    if exitcode is None:
        return "gone (exit code not seen)"
    name = signal_name(exitcode)
    if name == "SIGKILL" and not short:
        return f"killed by SIGKILL (exit code {exitcode}: {OOM_OR_KILL})"
    if name == "SIGTERM":
        return f"terminated by SIGTERM (exit code {exitcode})"
    if name is not None:
        return f"killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def _likely_cause(exitcode: int | None) -> int:
    """Order of ends seen at one moment (one look of a parent found several children
    ended): a kill from outside (SIGKILL, a crash) before an error exit, before the
    SIGTERM or clean exit with which vLLM stops the other ranks, before an unseen end."""
    if exitcode is None:
        return 4
    if exitcode == 0:
        return 3
    if signal_name(exitcode) in ("SIGTERM", "SIGINT"):
        return 2
    return 1 if exitcode > 0 else 0


def _rest(
    roles: Mapping[int, str],
    counted: set[int],
    alive: set[int],
    api_pid: int | None,
    before: float | None,
    first_at: float,
) -> list[Fate]:
    """The fates of the ranks with no end of their own before ``before``: alive, or (after
    a stop opsctl began at ``before``) ended by that stop; in rank order."""
    known = dict(roles)
    if api_pid is not None:
        known.setdefault(api_pid, ranks.API_SERVER)
    out = []
    for pid in sorted(set(known) - counted):
        role = role_of(pid, known) or (ranks.API_SERVER if pid == api_pid else None)
        if role is None:
            continue
        if pid in alive:
            out.append(Fate(pid, role, "alive"))
        elif before is not None:
            out.append(Fate(pid, role, "stopped", None, round(max(0.0, before - first_at), 1)))
    return ranks.by_rank(out, lambda f: f.role)


def roles_from_log(log: str) -> dict[int, str]:
    """pid -> role from vLLM's ``(ROLE pid=N)`` line prefixes (the last one seen wins)."""
    out: dict[int, str] = {}
    for line in log.splitlines():
        m = _PREFIX.match(line)
        if m:
            out[int(m.group(2))] = m.group(1)
    return out


def last_lines(log: str, pid: int, limit: int = 3) -> tuple[str, ...]:
    """The last ``limit`` lines process ``pid`` logged (its ``(ROLE pid=N)`` prefix cut)."""
    found = []
    for line in log.splitlines():
        m = _PREFIX.match(line)
        if m and int(m.group(2)) == pid and m.group(3).strip():
            found.append(m.group(3).strip()[:300])
    return tuple(found[-limit:])


def role_of(pid: int, roles: Mapping[int, str], name: str = "") -> str | None:
    """The rank role of ``pid``: known roles first, then its multiprocessing name."""
    role = roles.get(pid)
    if role is not None and ranks.parse_title(role) is not None:
        return role
    if name:
        rank = ranks.parse_title(name)
        if rank is not None:
            return rank.role
        for pattern, make in _NAMES:
            m = pattern.match(name)
            if m:
                return make(m)
    return role if role in (ranks.API_SERVER,) else None


def ends_of(
    exits: Iterable[Mapping],
    gone: Mapping[int, float],
    api: tuple[int, int | None, float | None] | None,
) -> dict[int, End]:
    """Every process end known, one per pid: exit records first, then opsctl's sightings."""
    out: dict[int, End] = {}
    for rec in exits:
        try:
            pid, when = int(rec["pid"]), float(rec["time"])
        except (KeyError, TypeError, ValueError):
            continue
        code = rec.get("exitcode")
        end = End(
            pid, when, code if isinstance(code, int) else None, "parent", str(rec.get("name") or "")
        )
        if pid not in out or end.time < out[pid].time:
            out[pid] = end
    if api is not None and api[2] is not None:
        api_pid, api_code, api_when = api[0], api[1], api[2]
        seen = out.get(api_pid)
        out[api_pid] = End(api_pid, seen.time if seen else api_when, api_code, "opsctl")
    for pid, gone_at in gone.items():
        if pid not in out:
            out[pid] = End(pid, gone_at, None, "seen gone")
    return out


# vLLM's rank processes from the leaves up: a worker's end fails its EngineCore's executor
# at once, while an EngineCore's end leaves its workers running for seconds (their
# "Parent process exited" wait; measured on 0.32): of ranks first seen gone in one look,
# with no exit code to tell them apart, the leaf went first
_LEAF_FIRST = {ranks.WORKER: 0, ranks.ENGINE_CORE: 1, ranks.COORDINATOR: 2, ranks.API_SERVER: 3}


def _leaf_order(role: str) -> int:
    rank = ranks.parse_title(role)
    return _LEAF_FIRST.get(rank.kind, 4) if rank is not None else 4


def first_death(
    exits: Iterable[Mapping],
    roles: Mapping[int, str],
    *,
    gone: Mapping[int, float] | None = None,
    api: tuple[int, int | None, float | None] | None = None,
    alive: Iterable[int] = (),
    log: str = "",
    before: float | None = None,
    serving: bool | None = None,
) -> FirstDeath | None:
    """The rank that ended first (before ``before``) and what the others did; None if none.

    ``api``: (API server pid, its exit code or None, when it was seen ended or None);
    ``alive``: pids that run now (the other ranks still alive)."""
    ends = ends_of(exits, gone or {}, api)
    api_pid = api[0] if api else None
    ranked: list[tuple[End, str]] = []
    for end in ends.values():
        role = role_of(end.pid, roles, end.name) or (
            ranks.API_SERVER if end.pid == api_pid else None
        )
        if role is None or (before is not None and end.time >= before):
            continue
        ranked.append((end, role))
    if not ranked:
        return None
    ranked.sort(key=lambda er: (er[0].time, _likely_cause(er[0].exitcode), _leaf_order(er[1])))
    first, role = ranked[0]
    others = [
        Fate(
            end.pid,
            r,
            "gone" if end.exitcode is None else "exited",
            end.exitcode,
            round(max(0.0, end.time - first.time), 1),
        )
        for end, r in ranked[1:]
    ]
    others += _rest(roles, {e.pid for e, _ in ranked}, set(alive), api_pid, before, first.time)
    server_up = api_pid is not None and api_pid in set(alive) and api_pid not in ends
    return FirstDeath(
        first.pid,
        role,
        first.exitcode,
        first.time,
        first.source,
        last_lines(log, first.pid),
        tuple(others),
        server_up,
        serving if server_up else None,
    )
