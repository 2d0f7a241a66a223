"""`opsctl status URL`: one-shot health and metrics snapshot of any vLLM server.

``--api-key`` (default ``VLLM_API_KEY``) is sent as a bearer token; a server that
refuses it (401/403) is "authentication required", exit 3. Typer only: the check is
:mod:`opsctl.checks.status`."""

from __future__ import annotations

import typer

from opsctl.commands.options import api_key_option


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        url: str = typer.Argument(
            ..., help="base URL of a vLLM server, e.g. http://127.0.0.1:8000"
        ),
        as_json: bool = typer.Option(False, "--json"),
        timeout: float = typer.Option(5.0, "--timeout", help="HTTP timeout in seconds"),
        api_key: str | None = api_key_option(),
    ) -> None:
        """Health and key metrics of a running vLLM server (exit 3 when unreachable)."""
        from opsctl.checks import status as check
        from opsctl.checks.target import UrlTarget
        from opsctl.output import emit

        report = check.run(UrlTarget(url, api_key or None), check.Options(timeout=timeout))
        doc = report.to_dict()
        emit(doc, as_json=as_json, render=lambda console: _render(console, doc))
        if not report.passed:
            raise typer.Exit(1)


def _render(console, doc: dict) -> None:
    from rich.table import Table

    t = Table(show_header=False)
    t.add_row("url", doc["url"])
    t.add_row("health", "ok" if doc["healthy"] else f"HTTP {doc['health_status']}")
    t.add_row("state", doc["state"] + (f" ({doc['reason']})" if doc["reason"] else ""))
    t.add_row("version", str(doc["version"]))
    t.add_row("platform", str(doc.get("platform")))
    t.add_row("models", ", ".join(doc["models"]) or "-")
    for k, v in (doc["metrics"] or {}).items():
        t.add_row(k, "-" if v is None else f"{v:g}")
    if doc["metrics_error"]:
        t.add_row("metrics", doc["metrics_error"])
    console.print(t)
