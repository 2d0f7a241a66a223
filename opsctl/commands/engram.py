"""`opsctl engram ...` (not yet built)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    engram_app = typer.Typer(help="Shared Engram host tables in /dev/shm.", no_args_is_help=True)
    app.add_typer(engram_app, name="engram")

    @engram_app.command("inspect")
    def _inspect() -> None:
        from opsctl.errors import BadInput

        raise BadInput("opsctl engram inspect is not available in this build")
