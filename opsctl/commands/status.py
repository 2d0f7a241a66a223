"""`opsctl status URL`: one-shot health and metrics snapshot of any vLLM server.

``--api-key`` (default ``VLLM_API_KEY``) is sent as a bearer token; a server that
refuses it (401/403) is "authentication required", exit 3."""

from __future__ import annotations

import typer

from opsctl.commands.options import api_key_option


def validate_url(url: str) -> str:
    import httpx

    from opsctl.errors import BadInput

    try:
        u = httpx.URL(url)
    except Exception:
        raise BadInput(f"not a valid URL: {url!r}") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise BadInput(f"not an http(s) URL: {url!r}")
    return url.rstrip("/")


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
        from rich.table import Table

        from opsctl.collectors import http
        from opsctl.collectors.metrics import fetch_health, fetch_metrics
        from opsctl.domain.metrics import key_metrics
        from opsctl.errors import EngineUnreachable
        from opsctl.output import document, emit

        base = validate_url(url)
        with http.client(api_key or None, timeout=timeout) as client:
            health = fetch_health(client, base)
            if health.status_code is None:
                raise EngineUnreachable(f"no server answered at {base}: {health.error}")
            if health.auth_refused is not None:
                raise http.auth_error(base, health.auth_refused, api_key)
            metrics = fetch_metrics(client, base)
        km = key_metrics(metrics) if metrics.error is None else None
        doc = document(
            "status",
            url=base,
            healthy=health.healthy,
            health_status=health.status_code,
            version=health.version,
            models=list(health.models),
            metrics=None
            if km is None
            else {
                "requests_running": km.running,
                "requests_waiting": km.waiting,
                "kv_cache_usage": km.kv_cache_usage,
                "prompt_tokens_total": km.prompt_tokens_total,
                "generation_tokens_total": km.generation_tokens_total,
                "ttft_mean_s": km.ttft_mean_s,
                "series": km.series,
            },
            metrics_error=metrics.error,
        )

        def render(console) -> None:
            t = Table(show_header=False)
            t.add_row("url", base)
            t.add_row("health", "ok" if health.healthy else f"HTTP {health.status_code}")
            t.add_row("version", str(health.version))
            t.add_row("models", ", ".join(health.models) or "-")
            for k, v in (doc["metrics"] or {}).items():
                t.add_row(k, "-" if v is None else f"{v:g}")
            if metrics.error:
                t.add_row("metrics", metrics.error)
            console.print(t)

        emit(doc, as_json=as_json, render=render)
        if not health.healthy:
            raise typer.Exit(1)
