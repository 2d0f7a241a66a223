"""`opsctl status URL`: one-shot health and metrics snapshot of any vLLM server.

Like ``systemctl status``: the state found is always reported (``--json``: the
``opsctl.status/3`` document, unreachable included) and the exit code follows it: 0
ready/busy, 1 a vLLM server that is not healthy, 3 no vLLM server answered (closed port,
timeout, a non-vLLM HTTP server) or the API key was refused, 2 a bad URL. Typer only: the
check is :mod:`opsctl.checks.status`."""

from __future__ import annotations

import typer

from opsctl.commands.options import (
    api_key_option,
    command,
    duration_option,
    json_option,
)
from opsctl.console.judge_state import CANARY_HELP

_CANARY_TIMEOUT = duration_option("10s", "--canary-timeout", help=CANARY_HELP)
_NO_CANARY = typer.Option(False, "--no-canary", help="send no canary request")


def register(app: typer.Typer) -> None:
    """Add ``opsctl status`` to ``app``."""

    @command(
        app,
        "status",
        "Health, state and key metrics of one vLLM server.",
        "opsctl status 127.0.0.1:8000",
        "opsctl status http://127.0.0.1:8000 --json",
        "opsctl status https://vllm.example:443 --api-key $KEY --timeout 10s",
    )
    def status(
        url: str = typer.Argument(
            ...,
            metavar="URL",
            help="a vLLM server: http://HOST:PORT, https://HOST:PORT or HOST:PORT",
        ),
        as_json: bool = json_option(),
        timeout: float = duration_option(
            "5s", "--timeout", help="the longest wait for each HTTP answer"
        ),
        api_key: str | None = api_key_option(),
        canary_timeout: float = _CANARY_TIMEOUT,
        no_canary: bool = _NO_CANARY,
    ) -> None:
        """Health, state and key metrics of a running vLLM server (systemctl-like exit:
        0 ready/busy, 1 unhealthy or stalled, 3 no vLLM server answered)."""
        from opsctl.checks import status as check
        from opsctl.checks.target import UrlTarget
        from opsctl.output import emit, error

        options = check.Options(
            timeout=timeout, canary_timeout=None if no_canary else canary_timeout
        )
        report = check.run(UrlTarget(url, api_key or None), options)
        doc = report.to_dict()
        emit(doc, as_json=as_json, render=lambda console: _render(console, doc))
        failure = check.error_of(report, api_key or None)
        if failure is not None:
            error(*failure)
        raise typer.Exit(int(check.exit_code(report)))


def _number(v) -> str:
    """A figure as a reader wants it: ``1,048,576``, ``0.0123``, ``-`` for unknown."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{int(v):,}" if float(v).is_integer() else f"{v:.4g}"


def _render(console, doc: dict) -> None:
    """The status table (the state found is the result, on stdout); when no server
    answered, why is the one stderr line, not said twice."""
    from rich.markup import escape
    from rich.table import Table

    health = doc["health_status"]
    t = Table(show_header=False)
    t.add_row("url", escape(doc["url"]))
    t.add_row(
        "health", "ok" if doc["healthy"] else "no answer" if health is None else f"HTTP {health}"
    )
    said = doc["reason"] and health is not None
    t.add_row("state", doc["state"] + (f" ({escape(doc['reason'])})" if said else ""))
    if health is None:
        console.print(t)
        return
    t.add_row("vllm_version", str(doc["vllm_version"] or "-"))
    t.add_row("platform", doc["platform"] or "not reported (no /server_info, not an opsctl run)")
    t.add_row("models", ", ".join(doc["models"]) or "-")
    procs = doc.get("processes") or []
    if procs:
        t.add_row("processes", ", ".join(f"{p['role']} {p['pid']}" for p in procs))
    if doc.get("canary"):
        t.add_row("canary", escape(doc["canary"]["detail"]))
    for k, v in (doc["metrics"] or {}).items():
        t.add_row(k, _number(v))
    if doc["metrics_error"] and doc["health_status"] is not None:
        t.add_row("metrics", escape(doc["metrics_error"]))
    console.print(t)
