"""`opsctl diag ...`: fault injection and verification on a live engine."""

from __future__ import annotations

import typer

from opsctl.commands.options import epilog


def register(app: typer.Typer) -> None:
    from opsctl.commands.diag import skeleton

    diag_app = typer.Typer(
        help="Fault injection and verification on a live engine: each diag checks a running "
        "server (URL) or starts its own engine (--model) and stops it after.",
        short_help="Fault injection and verification on a live engine.",
        epilog=epilog(
            "opsctl diag usage --model tiny-reranker",
            "opsctl diag invariance 127.0.0.1:8000 --json",
        ),
        no_args_is_help=True,
    )
    skeleton.register(diag_app)
    app.add_typer(diag_app, name="diag")
