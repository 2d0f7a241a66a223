"""What a tailed server log says, pure: load phase, decisive lines and a quiet tail.

The same facts the console reads from an opsctl run's server.log (opsctl.domain.serverlog;
the quiet tail leaves out our own polling), for a log file of a server opsctl did not start
(``console --log URL=FILE``). opsctl.console.logsource reads the file's end; this turns that
text into :class:`LogFacts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opsctl.domain.records import record
from opsctl.domain.serverlog import decisive_lines, load_progress

TAIL_LINES = 12
# access-log lines of polling (the console's own and load balancers'): left out of the tail
_POLL = ('"GET /metrics', '"GET /health', '"GET /v1/models', '"GET /version', '"GET /ping')


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What a tailed log holds: sizes, rotations, load phase, decisive lines and the tail."""

    path: str
    reason: str | None  # why nothing could be read ("log file not found: ..."), else None
    size_bytes: int | None  # the file's size at the last read
    read_bytes: int  # bytes of its end held (the file is never read whole)
    rotations: int  # times it was replaced or truncated while tailed
    load_phase: str | None  # the last start phase seen in what is held
    decisive_lines: tuple[str, ...]  # the last distinct error lines, most recent last
    tail: tuple[str, ...]  # the last lines, without polling access lines


def quiet(lines: list[str], n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` lines without the server's access lines for opsctl's own polling."""
    return [line for line in lines if not any(p in line for p in _POLL)][-n:]


def facts(
    path: str,
    text: str,
    *,
    size: int | None,
    rotations: int = 0,
    reason: str | None = None,
) -> LogFacts:
    """The facts of ``text`` (the held end of the file at ``path``)."""
    phase = load_progress(text).phase if text else None
    return LogFacts(
        path,
        reason,
        size,
        len(text.encode(errors="replace")),
        rotations,
        phase if phase != "starting" else None,
        tuple(decisive_lines(text)),
        tuple(quiet(text.splitlines()[-TAIL_LINES * 8 :])),
    )


def missing(path: str, why: str, rotations: int = 0) -> LogFacts:
    """The facts of a log that could not be read, with why."""
    return LogFacts(path, why, None, 0, rotations, None, (), ())


def log_dict(f: LogFacts | None) -> dict[str, Any] | None:
    """The log's facts as the report's ``log`` object holds them (None: no log)."""
    return None if f is None else record(f)
