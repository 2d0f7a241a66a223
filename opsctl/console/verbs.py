"""The console's ``:`` command mode: the CLI's verbs, parsed (no UI here).

:diag CHECK              run a check on the selected endpoint (usage, mm-uuid,
                         invariance, kv-fail)
:serve [MODEL] [--weights dummy|real] [--port N] [--max-model-len N]
                         start a server (embedded model or model directory)
:stop   :restart         the selected server (one opsctl started)
:runs clean [--older-than D]
                         reap orphaned engines (with --older-than also prune runs
                         that ended at least D ago)
:runs bundle [--out FILE]
                         forensics bundle of the selected endpoint's run
:admin ROUTE             a vLLM admin call on the selected server
:checks   :help   :quit
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.errors import BadInput

USAGE = (
    "diag CHECK | serve [MODEL] [--weights dummy|real] [--port N] | stop | restart | "
    "runs clean [--older-than D] | runs bundle [--out FILE] | admin ROUTE | checks | "
    "help | quit"
)


@dataclass(frozen=True)
class Command:
    """One console action to run: its verb and arguments."""

    verb: str  # diag | serve | stop | restart | runs-clean | runs-bundle | admin | checks |...
    args: dict[str, Any] = field(default_factory=dict)


def _flags(words: list[str], allowed: dict[str, type]) -> tuple[list[str], dict[str, Any]]:
    """Positional words and ``--flag value`` / ``--flag=value`` pairs of ``allowed``."""
    pos: list[str] = []
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            pos.append(w)
            i += 1
            continue
        name, eq, value = w.partition("=")
        if name not in allowed:
            raise BadInput(f"unknown option {name} (usage: {USAGE})")
        if not eq:
            if i + 1 >= len(words):
                raise BadInput(f"{name} needs a value")
            value = words[i + 1]
            i += 1
        try:
            out[name[2:].replace("-", "_")] = allowed[name](value)
        except ValueError:
            raise BadInput(f"{name}: not a valid value: {value!r}") from None
        i += 1
    return pos, out


def _duration(text: str) -> float:
    from opsctl.domain.runs import parse_duration

    return parse_duration(text)


def parse(text: str) -> Command:
    """A command line (without the ``:``) -> Command; BadInput with the usage otherwise."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"cannot parse {text!r}: {exc}") from None
    if not words:
        raise BadInput(f"usage: {USAGE}")
    verb, rest = words[0].lower(), words[1:]
    if verb in ("q", "quit", "exit"):
        return Command("quit")
    if verb in ("help", "?", "checks", "stop", "restart") and not rest:
        return Command("help" if verb == "?" else verb)
    if verb == "diag" and len(rest) == 1:
        return Command("diag", {"check": rest[0]})
    if verb == "serve":
        pos, opts = _flags(rest, {"--weights": str, "--port": int, "--max-model-len": int})
        if len(pos) > 1:
            raise BadInput("serve takes one MODEL (an embedded name or a model directory)")
        return Command("serve", {"model": pos[0] if pos else "tiny-llama", **opts})
    if verb == "runs" and rest[:1] == ["clean"]:
        pos, opts = _flags(rest[1:], {"--older-than": _duration})
        if not pos:
            return Command("runs-clean", opts)
    if verb == "runs" and rest[:1] == ["bundle"]:
        pos, opts = _flags(rest[1:], {"--out": Path})
        if not pos:
            return Command("runs-bundle", opts)
    if verb == "admin" and len(rest) == 1:
        return Command("admin", {"route": rest[0]})
    raise BadInput(f"not a console command: {text!r} (usage: {USAGE})")
