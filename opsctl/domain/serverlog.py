"""Reading a vLLM server log: load phases with their timings, and the lines that explain a death."""

from __future__ import annotations

import re
from dataclasses import dataclass

# (phase name, substring that marks it) in the order a healthy start passes them
PHASES: tuple[tuple[str, str], ...] = (
    ("api server up", "vLLM API server version"),
    ("engine core init", "Initializing a V1 LLM engine"),
    ("loading model", "Starting to load model"),
    ("weights loaded", "Loading weights took"),
    ("kv cache sized", "KV cache size"),
    ("engine initialised", "init engine (profile, create kv cache, warmup model) took"),
    ("http listening", "Starting vLLM server on"),
    ("ready", "Application startup complete"),
)

_SECONDS = re.compile(r"took ([0-9.]+) ?s")
_ERROR_LINE = re.compile(
    r"\b(\w*(Error|Exception)|Traceback|CRITICAL|ERROR|killed|Killed|error:)\b"
)
_LEVEL_NOT_ERROR = re.compile(r"\b(WARNING|INFO|DEBUG) \d\d-\d\d ")
_NOISE = ("DeprecationWarning", "UserWarning", "warnings.warn", "resource_tracker", "nanobind")
# uvicorn's access log: `INFO:     127.0.0.1:5872 - "POST /v1/completions HTTP/1.1" 500
# Internal Server Error` says a request failed, never why (it names no process either)
_ACCESS_LINE = re.compile(r'^INFO:\s+\S+ - "')


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """How far a server's start got: the last phase, its step of the total, and timings."""

    phase: str  # last phase reached ("starting" before any)
    step: int  # 0..len(PHASES)
    total: int
    weights_seconds: float | None
    engine_init_seconds: float | None


def load_progress(log: str) -> LoadProgress:
    """The load progress a server log shows: the last phase reached and its timings."""
    step = 0
    phase = "starting"
    weights = init = None
    for i, (name, marker) in enumerate(PHASES, start=1):
        idx = log.find(marker)
        if idx < 0:
            continue
        step, phase = max(step, i), name if i > step else phase
        line = log[idx : log.find("\n", idx) if log.find("\n", idx) >= 0 else None]
        m = _SECONDS.search(line)
        if m and name == "weights loaded":
            weights = float(m.group(1))
        if m and name == "engine initialised":
            init = float(m.group(1))
    return LoadProgress(phase, step, len(PHASES), weights, init)


def decisive_lines(log: str, limit: int = 3) -> list[str]:
    """The last distinct error lines (exception messages, argparse errors), most recent last.

    Traceback frames (also those vLLM logs line by line), warnings, WARNING-level log
    lines and the access log's failed requests (HTTP 500) are skipped; a pydantic validation
    error brings its indented detail line along.
    """
    found: list[str] = []
    lines = log.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line or line.startswith(("File ", "Traceback")) or any(n in line for n in _NOISE):
            continue
        if _LEVEL_NOT_ERROR.search(line) or not _ERROR_LINE.search(line):
            continue
        if _ACCESS_LINE.search(line) or _traceback_body(line):
            continue
        text = re.sub(r"^\((\w+) pid=\d+\)\s*", r"\1: ", line)
        if "validation error" in line and i + 1 < len(lines) and lines[i + 1].startswith("  "):
            text += ": " + lines[i + 1].strip()
        if text in found:
            found.remove(text)
        found.append(text[:400])
    return found[-limit:]


# a vLLM log line's head: `(EngineCore pid=7) ERROR 12-06 10:59:22 [core.py:1512] `
_VLLM_HEAD = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] ?")


def _traceback_body(line: str) -> bool:
    """A traceback logged through vLLM's logger line by line: its head, a frame, a source
    line or a caret marker (the exception's own message is kept)."""
    m = _VLLM_HEAD.match(line)
    if m is None:
        return False
    body = line[m.end() :]
    if body.startswith(("File ", "Traceback", " ")):
        return True
    return bool(body) and set(body) <= {"^", "~"}


def argparse_error(log: str) -> str | None:
    """The argparse 'error:' line vLLM prints for invalid server arguments."""
    for line in reversed(log.splitlines()):
        m = re.search(r"(?:api_server\.py|vllm|usage:.*?): error: (.*)$", line)
        if m:
            return m.group(1).strip()
        if ": error: " in line and (
            "unrecognized arguments" in line or "argument " in line or "invalid choice" in line
        ):
            return line.split(": error: ", 1)[1].strip()
    return None


# a bind that lost a race: the API server's socket (Python's OSError), or torch's
# c10d store (its EADDRINUSE), both taken by another process after the port was chosen
_PORT_TAKEN = re.compile(r"\[Errno 98\] Address already in use|\bEADDRINUSE\b")


def port_taken(log: str) -> bool:
    """The server died because a port it was to listen on was taken meanwhile."""
    return _PORT_TAKEN.search(log) is not None
