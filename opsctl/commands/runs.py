"""`opsctl runs list | clean | bundle`: the run directories opsctl's engines leave,
orphaned engines, leaked vLLM /dev/shm segments, and a forensics bundle of one run.

Typer only: the checks are :mod:`opsctl.checks.runs` (collector
opsctl.collectors.runs, decisions opsctl.domain.runs) and :mod:`opsctl.checks.bundle`,
rendering :mod:`opsctl.ui.render_runs` and :mod:`opsctl.ui.render_bundle`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import api_key_option


def _duration(text: str, flag: str) -> float:
    from opsctl.domain.runs import parse_duration
    from opsctl.errors import BadInput

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise BadInput(f"{flag}: {exc}") from None


def register(app: typer.Typer) -> None:
    runs_app = typer.Typer(
        help="Run directories of opsctl's engines: list, reap orphans, prune; leaked vLLM /dev/shm.",
        no_args_is_help=True,
    )
    app.add_typer(runs_app, name="runs")

    @runs_app.command("list")
    def list_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
        """Every run directory: model, url, started, state (live / stopped / orphaned /
        dead / unknown), engine pids, disk size."""
        from opsctl.checks import runs
        from opsctl.output import emit, info
        from opsctl.ui.render_runs import render_list

        doc = runs.list_runs().to_dict()
        if not doc["runs"] and not as_json:  # nothing to show: a note on stderr, no table
            info(f"no run directories in {doc['runs_dir']}", markup=False)
            return
        emit(doc, as_json=as_json, render=lambda console: render_list(console, doc))

    @runs_app.command("clean")
    def clean_cmd(
        older_than: str = typer.Option(
            "0s",
            "--older-than",
            help="prune only stopped/dead runs that ended at least this long ago "
            "(30s, 10m, 2h, 1d; default 0s: every finished run)",
        ),
        yes: bool = typer.Option(
            False, "--yes", help="really reap/prune/remove (default: dry run)"
        ),
        with_shm: bool = typer.Option(
            False,
            "--shm",
            help="also list vLLM /dev/shm segments (psm_*, sem.mp-*) no process maps or "
            "holds open and older than --min-age; --yes removes them",
        ),
        min_age: str = typer.Option(
            "60s", "--min-age", help="with --shm: never remove a segment younger than this"
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="with --shm --yes: remove even though some processes' maps/fds could not be read",
        ),
        grace: str = typer.Option(
            "15s", "--grace", help="reap: SIGTERM, then SIGKILL of what is left by this time"
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Reap orphaned engines (pid AND start time match meta.json), remove the /dev/shm
        segments they leave (only those no live process maps or holds open), and prune
        stopped/dead run directories whose opsctl is gone. Dry run without --yes.

        Exit 1 when --yes could not do something it listed (a process survived, a
        directory could not be removed, segments were refused)."""
        from opsctl import output
        from opsctl.checks import runs
        from opsctl.errors import CheckFailed
        from opsctl.ui.render_runs import render_clean

        opts = runs.CleanOptions(
            older_than=_duration(older_than, "--older-than"),
            min_age=_duration(min_age, "--min-age"),
            grace=_duration(grace, "--grace"),
            yes=yes,
            shm=with_shm,
            force=force,
        )
        report = runs.clean(opts)
        doc = report.to_dict()
        output.emit(doc, as_json=as_json, render=lambda console: render_clean(console, doc))
        if report.failure:
            raise CheckFailed(report.failure)
        if report.hint:
            output.info(report.hint)

    _register_bundle(runs_app)


def _register_bundle(runs_app: typer.Typer) -> None:
    @runs_app.command("bundle")
    def bundle_cmd(
        run: str = typer.Argument(..., help="a run's name (opsctl runs list) or its directory"),
        out: Path = typer.Option(
            None, "--out", help="archive to write (default ./opsctl-bundle-RUN.tar.gz)"
        ),
        api_key: str = api_key_option(),
        no_fetch: bool = typer.Option(
            False, "--no-fetch", help="do not ask a live server for /metrics, /server_info"
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """A tar.gz forensics bundle of one run for a bug report: server log, meta.json,
        patch ledger, probe events, the server's /metrics and /server_info while it
        lives, environment and versions; API keys, tokens, passwords redacted."""
        from opsctl import output
        from opsctl.checks import bundle
        from opsctl.ui.render_bundle import render_bundle

        opts = bundle.Options(run=run, out=out, api_key=api_key, fetch=not no_fetch)
        doc = bundle.bundle(opts).to_dict()
        output.emit(doc, as_json=as_json, render=lambda console: render_bundle(console, doc))
