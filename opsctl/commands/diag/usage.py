"""`opsctl diag usage` (not yet built)."""

from __future__ import annotations

import typer

from opsctl.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("usage", help="(not yet available)")
    def _cmd() -> None:
        raise BadInput("opsctl diag usage is not available in this build")
