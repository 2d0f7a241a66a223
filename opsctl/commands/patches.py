"""`opsctl patches [--run DIR]`: the engine-patch ledger of a run (what every vLLM
process really applied)."""

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
        from rich.table import Table

        from opsctl import paths
        from opsctl.collectors.ledger import latest_run, read_records
        from opsctl.errors import BadInput
        from opsctl.output import document, emit

        if run is None:
            run = latest_run(paths.runs_dir())
            if run is None:
                raise BadInput(
                    f"no run directory with a ledger under {paths.runs_dir()}",
                    hint="start an engine with `opsctl serve` or pass --run DIR",
                )
        if not run.is_dir():
            raise BadInput(f"run directory {run} does not exist")
        records = read_records(run)
        if not records:
            raise BadInput(f"{run} has no patch ledger (ledger/*.json)")
        doc = document("patches", run_dir=str(run), processes=records)

        def render(console) -> None:
            t = Table(
                "pid", "role", "vLLM", "patch", "status", "detail", title=f"patch ledger: {run}"
            )
            for r in records:
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

        emit(doc, as_json=as_json, render=render)
