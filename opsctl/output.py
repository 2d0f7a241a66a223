"""One emitter for command results.

stdout carries results only: a schema-versioned JSON document with ``--json``,
otherwise rich tables (plain text when stdout is not a terminal). Progress, warnings
and hints go to stderr through :func:`info` / :func:`warn`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console

SCHEMA_PREFIX = "opsctl."


# Piped output is never wrapped or cut: a line is as long as its content (like kubectl).
PIPE_WIDTH = 1 << 15


class PlainConsole(Console):
    """The console for a stdout that is not a terminal.

    Every rich Table is printed as plain full-width columns (no box characters, no
    wrapping, no cut cells, no trailing blanks), so ``opsctl ... | cat``, ``grep`` and
    ``awk`` see whole values.
    """

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Print like rich, tables as plain columns."""
        from rich.table import Table

        if not any(isinstance(o, Table) for o in objects):
            super().print(*objects, **kwargs)
            return
        with self.capture() as captured:
            super().print(
                *(plain_table(o) if isinstance(o, Table) else o for o in objects), **kwargs
            )
        self.file.write("\n".join(line.rstrip() for line in captured.get().split("\n")))
        self.file.flush()


def plain_table(table: Any) -> Any:
    """``table`` as plain columns.

    No box, no edge padding, cells never wrapped or cut, the title (if any) on its own
    line at the left.
    """
    table.box = None
    table.show_edge = False
    table.pad_edge = False
    table.expand = False
    table.padding = (0, 2, 0, 0)
    table.title_justify = "left"
    table.caption_justify = "left"
    for column in table.columns:
        column.no_wrap = True
        column.overflow = "ignore"
        column.max_width = None
        column.width = None
    return table


def stdout_console() -> Console:
    """Rich on a terminal; :class:`PlainConsole` (no wrapping, plain tables) otherwise.

    ``NO_COLOR`` turns colours off (rich reads it), ``FORCE_COLOR`` on.
    """
    if sys.stdout.isatty():
        return Console(file=sys.stdout, soft_wrap=False)
    return PlainConsole(file=sys.stdout, soft_wrap=True, width=PIPE_WIDTH)


def stderr_console() -> Console:
    """The console for progress and warnings.

    Never wrapped when stderr is not a terminal: a log line stays one line.
    """
    if sys.stderr.isatty():
        return Console(file=sys.stderr)
    return Console(file=sys.stderr, soft_wrap=True, width=PIPE_WIDTH)


def document(schema: str, /, **fields: Any) -> dict[str, Any]:
    """A JSON result document: ``{"schema": "opsctl.<name>/<version>", ...}``.

    ``schema`` is ``"<name>"`` (version 1) or ``"<name>/<version>"``. The schema takes no
    keyword, so every keyword is a field: ``document("status", version="0.32.0")`` keeps
    the server's version as a field (it once became the schema version)."""
    name, _, version = schema.partition("/")
    if not name or "/" in version or not (version or "1").isdigit():
        raise ValueError(f"schema must be '<name>' or '<name>/<int>', not {schema!r}")
    if "schema" in fields:
        raise ValueError("'schema' is not a field name")
    return {"schema": f"{SCHEMA_PREFIX}{name}/{version or 1}", **fields}


class PrintedDocuments:
    """The schemas of the JSON documents :func:`emit` printed while a record was open.

    See :func:`recording`: the CLI prints an error document for a ``--json`` command
    that failed before printing its own.
    """

    def __init__(self) -> None:
        self.schemas: list[str] = []


_OPEN_RECORDS: list[PrintedDocuments] = []  # the records of the commands now running


@contextlib.contextmanager
def recording() -> Iterator[PrintedDocuments]:
    """Record the JSON documents printed while the ``with`` block runs (any thread)."""
    record = PrintedDocuments()
    _OPEN_RECORDS.append(record)
    try:
        yield record
    finally:
        _OPEN_RECORDS.remove(record)


def emit(doc: dict[str, Any], *, as_json: bool, render: Callable[[Console], None]) -> None:
    """Print a command's result: ``doc`` as JSON with ``--json``, else ``render`` it.

    ``render`` gets the stdout console (rich on a terminal, plain columns in a pipe).
    """
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()
        for record in list(_OPEN_RECORDS):
            record.schemas.append(str(doc.get("schema")))
    else:
        render(stdout_console())


def emit_report(report: Any, *, as_json: bool, render: Callable[[Console, dict], None]) -> None:
    """``emit`` a report's document, then exit 1 on its ``failure``, else say its ``hint``."""
    from opsctl.errors import CheckFailed

    doc = report.to_dict()
    emit(doc, as_json=as_json, render=lambda console: render(console, doc))
    if report.failure:
        raise CheckFailed(report.failure)
    if report.hint:
        info(report.hint)


ERROR_SCHEMA = "error/1"
ERROR_STATES = {1: "failed", 3: "unreachable", 4: "timeout", 130: "interrupted"}


def error_document(command: str, exit_code: int, message: str, hint: str | None) -> dict:
    """The ``opsctl.error/1`` document of a ``--json`` command that failed early.

    Printed when the command fails before its own report exists (no vLLM server
    answered, a timeout, an interruption).
    """
    return document(
        ERROR_SCHEMA,
        command=command,
        state="unauthorized"
        if message.startswith("authentication required")
        else ERROR_STATES.get(exit_code, "failed"),
        error=message,
        hint=hint,
        exit_code=exit_code,
    )


def info(message: str, *, markup: bool = True) -> None:
    """A progress line on stderr; ``markup=False`` for text that may hold [brackets]."""
    stderr_console().print(message, highlight=False, markup=markup)


def error(message: str, hint: str | None = None) -> None:
    """The one ``opsctl: error:`` line (and its ``hint:``) on stderr."""
    print(f"opsctl: error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def warn(message: str) -> None:
    """A yellow ``warning:`` line on stderr."""
    from rich.markup import escape

    stderr_console().print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


def human_bytes(n: float | None) -> str:
    """``n`` bytes in binary units (``1.5 GiB``); ``-`` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def want_tui(flag: bool | None, as_json: bool = False) -> bool:
    """Whether to run a dashboard: by default on a terminal (and not with --json).

    When --tui is asked for without a terminal, say so with the flag for plain output
    and run plain instead.
    """
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    if flag is None:
        return interactive and not as_json
    if flag and not interactive:
        warn(
            "the dashboard needs a terminal (stdin and stdout are not TTYs); running plain. "
            "hint: use --no-tui or --json for plain output"
        )
        return False
    return flag


SEVERITY_COLOURS = {"ok": "green", "info": "cyan", "warning": "yellow", "fail": "red"}
VERDICT_COLOURS = {"pass": "green", "unverified": "yellow", "inconclusive": "yellow"}


def render_findings(console: Console, findings: list[dict], verdict: str, suffix: str = "") -> None:
    """The common tail of every check's rich output.

    One line per finding (with its hint, if any), then the coloured verdict.
    """
    from rich.markup import escape

    for f in findings:
        colour = SEVERITY_COLOURS.get(f["severity"], "white")
        console.print(f"[{colour}]{f['severity']:>7}[/] {escape(f['message'])}", highlight=False)
        hint = (f.get("details") or {}).get("hint")
        if hint:
            console.print(f"        hint: {escape(str(hint))}", highlight=False)
    colour = VERDICT_COLOURS.get(verdict, "red")
    console.print(f"verdict: [b {colour}]{verdict.upper()}[/]{suffix}", highlight=False)
