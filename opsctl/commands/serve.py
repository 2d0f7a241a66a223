"""`opsctl serve [MODEL] [-- extra vLLM args]`: start, supervise and stop a vLLM server."""

from __future__ import annotations

import typer

LOAD_FORMATS = ("auto", "dummy")


def register(app: typer.Typer) -> None:
    @app.command(
        "serve",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def serve(
        ctx: typer.Context,
        model: str = typer.Argument(
            None, help="embedded model name or model directory (default tiny-llama)"
        ),
        load_format: str = typer.Option(
            "auto", "--load-format", help="dummy (random/constant) or auto (real weights)"
        ),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8000, "--port"),
        timeout: float = typer.Option(300.0, "--timeout", help="seconds to wait for /health"),
        tui: bool = typer.Option(
            None, "--tui/--no-tui", help="live dashboard (default: on a terminal)"
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON lines: ready and stopped events"),
    ) -> None:
        """Start vLLM's OpenAI server with opsctl's plugin; supervise until Ctrl-C/SIGTERM.

        Extra vLLM server arguments go after `--`.
        """
        from opsctl.commands.serve_run import ServeRequest, run_serve
        from opsctl.errors import BadInput

        extra = list(ctx.args)
        if model is not None and model.startswith("-"):
            extra.insert(0, model)
            model = None
        if load_format not in LOAD_FORMATS:
            raise BadInput(
                f"--load-format must be one of {', '.join(LOAD_FORMATS)}, not {load_format!r}"
            )
        if timeout <= 0:
            raise BadInput("--timeout must be positive")
        code = run_serve(ServeRequest(model, load_format, host, port, timeout, tui, as_json, extra))
        raise typer.Exit(code)
