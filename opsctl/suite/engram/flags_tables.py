"""`opsctl engram inspect | plan | clean`: DeepSeek V4.1 Engram host tables.

- ``inspect``: every ``vllm_engram_*`` table on this node (files and deleted mappings),
  who maps it (RSS/PSS), the scale block size and fill verification. Exit 1 on a fill
  mismatch, or when verification was requested but could not complete for a table.
- ``plan``: table bytes per rank and node for a TP/DP layout, and whether /dev/shm (or
  ``--shm-size``) holds them (vLLM's fallback decision).
- ``clean``: orphaned ``vllm_engram_*`` files, removed only with ``--yes`` (CLEAN_HELP below).

Typer only: the library calls are :mod:`opsctl.suite.engram.run_tables`, rendering
:mod:`opsctl.suite.engram.view_tables`.
Heavy imports stay inside the commands."""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import duration_option, epilog, json_option, tui_option

PREFIX_HELP = "table name prefix (narrow it to one run)"
INSPECT_TUI_HELP = "show progress and results in the dashboard panel (default: plain, stderr)"
EXAMPLES = {
    "inspect": epilog(
        "opsctl engram inspect",
        "opsctl engram inspect --verify full --json",
        "opsctl engram inspect --pid 4242 --verify none",
    ),
    "plan": epilog(
        "opsctl engram plan --config deepseek-v4.1-flash --tp 2 --dp 4",
        "opsctl engram plan --model ./my-model --shm-size 64G --json",
    ),
    "clean": epilog(
        "opsctl engram clean",
        "opsctl engram clean --yes --min-age 10m",
        "opsctl engram clean --json",
    ),
}
CLEAN_HELP = """List orphaned vllm_engram_* files in /dev/shm (no live process maps them or holds
them open, older than --min-age); --yes removes them.

Only processes in this PID namespace can be seen: a file held only by a process in another
container looks orphaned, so run clean where vLLM runs. If some process's mappings or open files
cannot be read, --yes removes nothing (exit 1) unless --force is given. Exit 1 whenever --yes kept
an orphan."""


def inspect_cmd(
    pid: list[int] = typer.Option(
        [], "--pid", help="only look at these processes' mappings (repeatable)"
    ),
    verify: str = typer.Option(
        "sample", "--verify", help="fill verification: sample | full | none"
    ),
    prefix: str = typer.Option("vllm_engram_", "--prefix", help=PREFIX_HELP),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        help="force the ue8m0 scale block (elements per scale byte); default: decided "
        "from the size, else from the data, else 32 (what vLLM 0.32 builds)",
    ),
    as_json: bool = json_option(),
    tui: bool | None = tui_option(help=INSPECT_TUI_HELP),
) -> None:
    """Find Engram tables (files and deleted mappings), who maps them, and verify the fill.

    Exit 1 on a fill mismatch or when verification could not complete for a table."""
    from opsctl.suite.engram import run_tables
    from opsctl.suite.engram.view_tables import render_inspect
    from opsctl.ui.progress import run_with_progress

    opts = run_tables.InspectOptions(tuple(pid), verify, prefix, block_size)
    report = run_with_progress(
        "engram inspect", lambda p: run_tables.inspect(opts, p), tui=tui, as_json=as_json
    )
    _finish(report, as_json, render_inspect)


def plan_cmd(
    model: Path | None = typer.Option(None, "--model", help="model directory with a config.json"),
    config: str | None = typer.Option(
        None, "--config", help="config JSON file, or a shipped example: deepseek-v4.1-flash"
    ),
    tp: int = typer.Option(1, "--tp", help="tensor parallel size"),
    dp: int = typer.Option(1, "--dp", help="data parallel size"),
    nodes: int = typer.Option(1, "--nodes", help="nodes the DP replicas spread over"),
    shm_size: str | None = typer.Option(
        None,
        "--shm-size",
        help="/dev/shm size to plan for (e.g. 64M, 200G); default: this host's free /dev/shm",
    ),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        help="elements per ue8m0 scale byte (default: config engram_scale_block_size, "
        "else 32, what vLLM 0.32 builds)",
    ),
    as_json: bool = json_option(),
) -> None:
    """Engram table bytes per rank/node for TP/DP, shared vs private, and the /dev/shm check."""
    from opsctl.suite.engram import run_tables
    from opsctl.suite.engram.view_tables import render_plan

    opts = run_tables.PlanOptions(model, config, tp, dp, nodes, shm_size, block_size)
    _finish(run_tables.plan(opts), as_json, render_plan)


def clean_cmd(
    yes: bool = typer.Option(
        False, "--yes", help="really remove the orphans (default: only list them)"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="with --yes: remove even though some processes' mappings or fds could not be read",
    ),
    prefix: str = typer.Option("vllm_engram_", "--prefix", help="only files with this prefix"),
    min_age: float = duration_option(
        "60s",
        "--min-age",
        help="never remove a table changed less than this long ago (30, 30s, 10m, 2h, 1d; 0: any)",
        allow_zero=True,
    ),
    as_json: bool = json_option(),
) -> None:
    """``engram clean``: list (with --yes remove) orphaned Engram tables (help: CLEAN_HELP)."""
    from opsctl.suite.engram import run_tables
    from opsctl.suite.engram.view_tables import render_clean

    report = run_tables.clean(run_tables.CleanOptions(prefix, yes, force, min_age))
    _finish(report, as_json, render_clean)


def register(app: typer.Typer) -> None:
    """Add ``opsctl engram`` and its inspect, plan and clean commands to ``app``."""
    engram_app = typer.Typer(help="Shared Engram host tables in /dev/shm.", no_args_is_help=True)
    app.add_typer(engram_app, name="engram")
    for name, cmd, summary in (  # summaries: `opsctl engram --help` cuts longer docstrings
        ("inspect", inspect_cmd, "Engram tables in /dev/shm and live processes; verify the fill."),
        ("plan", plan_cmd, "Engram table bytes per rank and node; does /dev/shm hold them."),
        ("clean", clean_cmd, "List (and with --yes remove) orphaned Engram tables."),
    ):
        help = CLEAN_HELP if name == "clean" else None  # None: the docstring
        engram_app.command(name, epilog=EXAMPLES[name], short_help=summary, help=help)(cmd)


def _finish(report, as_json: bool, render) -> None:
    """Warnings (stderr), the result (stdout, once), then exit 1 on a failure, else the hint."""
    from opsctl import output

    for line in report.warnings:
        output.warn(line)
    output.emit_report(report, as_json=as_json, render=render)
