"""`opsctl patches [--run RUN]`: the engine-patch ledger of a run (what every vLLM
process really applied). Typer only: the check is :mod:`opsctl.checks.patches`."""

from __future__ import annotations

import typer

from opsctl.commands.options import RUN_HELP, epilog, json_option, run_path


def register(app: typer.Typer) -> None:
    @app.command(
        "patches",
        short_help="The engine-patch ledger of a run.",
        epilog=epilog(
            "opsctl patches",
            "opsctl patches --run 20260101-000000-serve-tiny-llama-8000",
            "opsctl patches --run ~/.cache/opsctl/runs/20260101-000000-serve-tiny-llama-8000 --json",
        ),
    )
    def patches(
        run: str | None = typer.Option(
            None, "--run", metavar="RUN", help=RUN_HELP + " (default: the latest run)"
        ),
        as_json: bool = json_option(),
    ) -> None:
        """Show the per-process patch ledger of a run directory."""
        from opsctl.checks import patches as check
        from opsctl.output import emit

        run_dir = run_path(run) if run is not None else None
        doc = check.run(check.Options(run_dir=run_dir)).to_dict()
        emit(doc, as_json=as_json, render=lambda console: _render(console, doc))


def _render(console, doc: dict) -> None:
    from rich.table import Table

    t = Table(
        "pid", "role", "vLLM", "patch", "status", "detail", title=f"patch ledger: {doc['run_dir']}"
    )
    for r in doc["processes"]:
        for p in r.get("patches", []):
            detail = (p.get("detail") or "").splitlines()
            t.add_row(
                str(r["pid"]),
                r["role"],
                r.get("vllm_version", "?"),
                p["name"],
                p["status"],
                detail[0] if detail else "",
            )
    console.print(t)
