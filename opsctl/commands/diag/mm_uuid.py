"""`opsctl diag mm-uuid` (not yet built)."""

from __future__ import annotations

import typer

from opsctl.errors import BadInput


def register(app: typer.Typer) -> None:
    @app.command("mm-uuid", help="(not yet available)")
    def _cmd() -> None:
        raise BadInput("opsctl diag mm-uuid is not available in this build")
