"""`opsctl diag ...`: fault injection and verification on a live engine."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    from opsctl.commands.diag import invariance, kv_fail, lora, mm_uuid, usage

    diag_app = typer.Typer(
        help="Fault injection and verification on a live engine.", no_args_is_help=True
    )
    for module in (kv_fail, usage, mm_uuid, invariance, lora):
        module.register(diag_app)
    app.add_typer(diag_app, name="diag")
