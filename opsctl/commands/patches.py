"""`opsctl patches [--run DIR]`: the engine-patch ledger of a run (what every vLLM
process really applied). Typer only: the check is :mod:`opsctl.checks.patches`."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("patches")
    def patches(
        run: Path | None = typer.Option(
            None, "--run", help="run directory (default: the latest run)"
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Show the per-process patch ledger of a run directory."""
        from opsctl.checks import patches as check
        from opsctl.output import emit

        doc = check.run(check.Options(run_dir=run)).to_dict()
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
