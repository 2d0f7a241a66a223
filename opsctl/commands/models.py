"""`opsctl models build | list`: the embedded tiny models."""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import command, epilog, json_option


def register(app: typer.Typer) -> None:
    """Add ``opsctl models`` and its commands to ``app``."""
    models_app = typer.Typer(
        help="Embedded tiny models (generated offline).",
        epilog=epilog("opsctl models list", "opsctl models build tiny-llama"),
        no_args_is_help=True,
    )
    app.add_typer(models_app, name="models")

    command(
        models_app,
        "build",
        "Write the embedded models (tokenizer, config, weights).",
        "opsctl models build",
        "opsctl models build tiny-llama tiny-vlm --force",
        "opsctl models build tiny-llama --out ./models --json",
    )(build)

    command(
        models_app,
        "list",
        "The embedded models: name, kind, path, size.",
        "opsctl models list",
        "opsctl models list --json",
    )(list_)


def build(
    names: list[str] = typer.Argument(
        None, metavar="[NAME]...", help="models to build (default: all)", show_default=False
    ),
    out: Path | None = typer.Option(
        None, "--out", help="directory to build into (default: $OPSCTL_HOME/models)"
    ),
    force: bool = typer.Option(False, "--force", help="rebuild even if present"),
    as_json: bool = json_option(),
) -> None:
    """Write the embedded models: tokenizer, config.json, seeded safetensors.

    An existing model directory is replaced only when opsctl built it (its marker
    file); anything else at the target path is left alone (exit 2, with the path)."""
    from opsctl.embedded import catalog
    from opsctl.output import document, emit

    specs = [catalog.get(n) for n in names] if names else list(catalog.CATALOG.values())
    for spec in specs:  # refuse before building anything: never replace what we did not build
        catalog.check_target(spec, out)
    rows = []
    for spec in specs:
        path = catalog.build(spec, out, force=force)
        rows.append(
            {
                "name": spec.name,
                "archetype": spec.archetype,
                "path": str(path),
                "size_bytes": catalog.dir_size(path),
            }
        )

    def render(console) -> None:
        for r in rows:
            console.print(f"built {r['name']:<14} {r['path']}")

    emit(document("models.build", models=rows), as_json=as_json, render=render)


def list_(as_json: bool = json_option()) -> None:
    """Show the embedded models: name, archetype, path, size, built or not."""
    from rich.table import Table

    from opsctl.embedded import catalog
    from opsctl.output import document, emit, human_bytes

    rows = []
    for spec in catalog.CATALOG.values():
        path = catalog.model_path(spec.name)
        built = catalog.is_built(spec)
        rows.append(
            {
                "name": spec.name,
                "archetype": spec.archetype,
                "description": spec.description,
                "path": str(path),
                "built": built,
                "size_bytes": catalog.dir_size(path) if built else None,
            }
        )

    def render(console) -> None:
        t = Table("name", "archetype", "path", "size", "description")
        for r in rows:
            t.add_row(
                r["name"],
                r["archetype"],
                r["path"] if r["built"] else "(built on first use)",
                human_bytes(r["size_bytes"]),
                r["description"],
            )
        console.print(t)

    emit(document("models.list", models=rows), as_json=as_json, render=render)
