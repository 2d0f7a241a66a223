"""`opsctl patches`: a run's engine-patch ledger, or the upgrade preflight (``--against``).

The ledger says what every vLLM process really applied; the preflight reads another vLLM
release's sources from its wheel (``--against VERSION|WHEEL``), without installing it, for
each patch and probe. Typer only: the checks are :mod:`opsctl.checks.patches` and
:mod:`opsctl.checks.preflight`."""

from __future__ import annotations

import typer

from opsctl.commands.options import RUN_HELP, command, json_option, run_path


def register(app: typer.Typer) -> None:
    """Add ``opsctl patches`` to ``app``."""

    @command(
        app,
        "patches",
        "The engine-patch ledger of a run.",
        "opsctl patches",
        "opsctl patches --run 20260101-000000-serve-tiny-llama-8000",
        "opsctl patches --run ~/.cache/opsctl/runs/20260101-000000-serve-tiny-llama-8000 --json",
        "opsctl patches --against 0.34.0",
        "opsctl patches --against ./vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl --json",
    )
    def patches(
        run: str | None = typer.Option(
            None, "--run", metavar="RUN", help=RUN_HELP + " (default: the latest run)"
        ),
        against: str | None = typer.Option(
            None,
            "--against",
            metavar="VERSION|WHEEL",
            help="upgrade preflight: check every patch and probe against this vLLM release "
            "(a version, downloaded once, or a wheel file) instead of showing a ledger",
        ),
        as_json: bool = json_option(),
    ) -> None:
        """Show the per-process patch ledger of a run directory, or (--against) whether
        each patch and probe still fits another vLLM release (exit 1 when one cannot)."""
        from opsctl.checks import patches as check
        from opsctl.output import emit

        if against is not None:
            _preflight(against, as_json)
            return

        run_dir = run_path(run) if run is not None else None
        doc = check.run(check.Options(run_dir=run_dir)).to_dict()
        emit(doc, as_json=as_json, render=lambda console: _render(console, doc))


def _preflight(against: str, as_json: bool) -> None:
    from opsctl.checks import preflight
    from opsctl.output import emit, warn
    from opsctl.ui import render_preflight
    from opsctl.ui.progress import run_with_progress

    report = run_with_progress(
        preflight.TITLE,
        lambda progress: preflight.run(against, preflight.Options(), progress),
        tui=False,
        as_json=as_json,
    )
    doc = report.to_dict()
    emit(doc, as_json=as_json, render=lambda console: render_preflight.render(console, doc))
    if doc["verdict"] == "unverified":
        warn(f"opsctl's patches are not verified on vLLM {doc.get('vllm_version') or against}")
    elif doc["verdict"] != "pass":
        raise typer.Exit(1)


def _render(console, doc: dict) -> None:
    from rich.table import Table

    t = Table(
        "pid",
        "rank",
        "vLLM",
        "patch",
        "status",
        "verified",
        "detail",
        title=f"patch ledger: {doc['run_dir']}",
    )
    for r in doc["processes"]:
        for p in r.get("patches", []):
            detail = (p.get("detail") or "").splitlines()
            t.add_row(
                str(r["pid"]),
                r.get("rank") or r["role"],
                r.get("vllm_version", "?"),
                p["name"],
                p["status"],
                _verified(p),
                detail[0] if detail else "",
            )
    console.print(t)


def _verified(p: dict) -> str:
    """'yes', 'NO (unverified on X)' or '?' (older ledgers, unknown vLLM version)."""
    if p.get("verified") is None:
        return "?"
    return "yes" if p["verified"] else f"NO ({p.get('note') or 'unverified'})"
