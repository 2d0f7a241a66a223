"""`opsctl runs list | clean | bundle`: run directories, orphans, leaked /dev/shm, bundles.

Typer only: the checks are :mod:`opsctl.checks.runs` (collector
opsctl.collectors.runs, decisions opsctl.domain.runs) and :mod:`opsctl.checks.bundle`,
rendering :mod:`opsctl.ui.render_runs` and :mod:`opsctl.ui.render_bundle`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import (
    RUN_HELP,
    api_key_option,
    command,
    duration_option,
    epilog,
    json_option,
)

LIST_HELP = """Every run directory: model, url, started, state (live / stopped / orphaned / dead /
unknown), engine pids, disk size."""
CLEAN_HELP = """Reap orphaned engines (pid AND start time match meta.json), remove the /dev/shm
segments they leave (only those no live process maps or holds open), and prune stopped/dead run
directories whose opsctl is gone. Dry run without --yes.

Exit 1 when --yes could not do something it listed (a process survived, a directory could
not be removed, segments were refused)."""
BUNDLE_HELP = """A tar.gz forensics bundle of one run for a bug report: server log, meta.json, patch
ledger, probe events, the server's /metrics and /server_info while it lives, environment and
versions; API keys, tokens, passwords redacted."""


def register(app: typer.Typer) -> None:
    """Add ``opsctl runs`` and its list, clean and bundle commands to ``app``."""
    runs_app = typer.Typer(
        help="Run directories of opsctl's engines: list, reap orphans, prune; leaked vLLM /dev/shm.",
        short_help="Run directories: list, clean, bundle.",
        epilog=epilog("opsctl runs list", "opsctl runs clean --yes", "opsctl runs bundle RUN"),
        no_args_is_help=True,
    )
    app.add_typer(runs_app, name="runs")

    command(
        runs_app,
        "list",
        "Every run directory, its state and its engines.",
        "opsctl runs list",
        "opsctl runs list --json",
        help=LIST_HELP,
    )(list_cmd)

    command(
        runs_app,
        "clean",
        "Reap orphaned engines, prune runs, free /dev/shm.",
        "opsctl runs clean",
        "opsctl runs clean --older-than 1d --yes",
        "opsctl runs clean --shm --min-age 10m --yes --json",
        help=CLEAN_HELP,
    )(clean_cmd)

    _register_bundle(runs_app)


def _register_bundle(runs_app: typer.Typer) -> None:
    command(
        runs_app,
        "bundle",
        "A forensics tar.gz of one run, secrets redacted.",
        "opsctl runs bundle 20260101-000000-serve-tiny-llama-8000",
        "opsctl runs bundle ~/.cache/opsctl/runs/20260101-000000-serve-tiny-llama-8000 "
        "--out bug.tar.gz --json",
        help=BUNDLE_HELP,
    )(bundle_cmd)


def list_cmd(as_json: bool = json_option()) -> None:
    """``runs list``: every run directory and its state (help: LIST_HELP)."""
    from opsctl.checks import runs
    from opsctl.output import emit, info
    from opsctl.ui.render_runs import render_list

    doc = runs.list_runs().to_dict()
    if not doc["runs"] and not as_json:  # nothing to show: a note on stderr, no table
        info(f"no run directories in {doc['runs_dir']}", markup=False)
        return
    emit(doc, as_json=as_json, render=lambda console: render_list(console, doc))


def clean_cmd(
    older_than: float = duration_option(
        "0s",
        "--older-than",
        help="prune only stopped/dead runs that ended at least this long ago "
        "(0: every finished run)",
        allow_zero=True,
    ),
    yes: bool = typer.Option(False, "--yes", help="really reap/prune/remove (default: dry run)"),
    with_shm: bool = typer.Option(
        False,
        "--shm",
        help="also list vLLM /dev/shm segments (psm_*, sem.mp-*) no process maps or "
        "holds open and older than --min-age; --yes removes them",
    ),
    min_age: float = duration_option(
        "60s",
        "--min-age",
        help="with --shm: never remove a segment younger than this",
        allow_zero=True,
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="with --shm --yes: remove even though some processes' maps/fds could not be read",
    ),
    grace: float = duration_option(
        "15s", "--grace", help="reap: SIGTERM, then SIGKILL of what is left by this time"
    ),
    as_json: bool = json_option(),
) -> None:
    """``runs clean``: reap orphaned engines, free their segments, prune runs (help: CLEAN_HELP)."""
    from opsctl import output
    from opsctl.checks import runs
    from opsctl.ui.render_runs import render_clean

    opts = runs.CleanOptions(
        older_than=older_than, min_age=min_age, grace=grace, yes=yes, shm=with_shm, force=force
    )
    output.emit_report(runs.clean(opts), as_json=as_json, render=render_clean)


def bundle_cmd(
    run: str = typer.Argument(..., metavar="RUN", help=RUN_HELP),
    out: Path = typer.Option(
        None, "--out", help="archive to write (default ./opsctl-bundle-RUN.tar.gz)"
    ),
    api_key: str = api_key_option(),
    no_fetch: bool = typer.Option(
        False, "--no-fetch", help="do not ask a live server for /metrics, /server_info"
    ),
    as_json: bool = json_option(),
) -> None:
    """``runs bundle``: write a forensics tar.gz of one run (help: BUNDLE_HELP)."""
    from opsctl import output
    from opsctl.checks import bundle
    from opsctl.ui.render_bundle import render_bundle

    opts = bundle.Options(run=run, out=out, api_key=api_key, fetch=not no_fetch)
    doc = bundle.bundle(opts).to_dict()
    output.emit(doc, as_json=as_json, render=lambda console: render_bundle(console, doc))
