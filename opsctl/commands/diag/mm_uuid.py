"""`opsctl diag mm-uuid`: which identifier each multimodal item reached the engine core
with (the check itself: opsctl.checks.mm_uuid).

With ``--model`` (default tiny-vlm-multi) it starts one engine per ``--mode`` entry
(caches-off, caches-on) with the mm_uuid engine probe on; with a URL it checks that one
engine, which opsctl must have started with the probe on (its run directory is found
from the URL or given with ``--run RUN``; ``--run-dir`` and ``--modes`` are hidden old
names).

Exit 1 when an explicit UUID is rewritten or a missing one does not get the expected
kind of id; 2 for bad input; 3 unreachable; 4 when the server does not answer within
--timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import (
    RUN_HELP,
    api_key_option,
    duration_option,
    epilog,
    json_option,
    run_path,
    test_knob_option,
    tui_option,
    url_argument,
    url_target,
)
from opsctl.domain.mm_uuid import DEFAULT_MODEL, MODES
from opsctl.domain.weights import LOAD_FORMAT_HELP, check_load_format
from opsctl.errors import BadInput, CheckFailed

if TYPE_CHECKING:
    from opsctl.checks import mm_uuid as check
    from opsctl.checks.target import Target


def register(app: typer.Typer) -> None:
    @app.command(
        "mm-uuid",
        short_help="Which multimodal identifier reached the engine core.",
        epilog=epilog(
            "opsctl diag mm-uuid",
            "opsctl diag mm-uuid --mode caches-on --json",
            "opsctl diag mm-uuid 127.0.0.1:8000 --run 20260101-000000-serve-tiny-vlm-multi-8000",
        ),
    )
    def mm_uuid(
        url: str | None = url_argument(
            "a vLLM server opsctl started with OPSCTL_PROBES=mm_uuid: http://HOST:PORT or "
            "HOST:PORT (else --model: opsctl starts the engines)"
        ),
        model: str | None = typer.Option(
            None, "--model", help=f"start this vision-language model (default {DEFAULT_MODEL})"
        ),
        run: str | None = typer.Option(
            None, "--run", metavar="RUN", help=RUN_HELP + " of the engine at URL"
        ),
        run_dir_alias: Path | None = typer.Option(None, "--run-dir", hidden=True),
        uuid_prefix: str = typer.Option(
            "opsctl", "--uuid-prefix", help="prefix of the explicit UUIDs sent"
        ),
        modes: str = typer.Option(
            "caches-off,caches-on",
            "--mode",
            metavar="MODE",
            help="with --model: engines to start, caches-off and/or caches-on (a comma list)",
        ),
        modes_alias: str | None = typer.Option(None, "--modes", hidden=True),
        load_format: str = typer.Option("auto", "--load-format", help=LOAD_FORMAT_HELP),
        as_json: bool = json_option(),
        tui: bool | None = tui_option(),
        timeout: float = duration_option(
            "2m", "--timeout", help="the longest wait for each HTTP answer (exit 4 past it)"
        ),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Show which multimodal identifier reached the engine core; exit 1 if an explicit UUID was rewritten."""
        from opsctl.checks import mm_uuid as check
        from opsctl.ui.progress import run_with_progress

        run_dir = run_path(run) if run is not None else run_dir_alias  # --run-dir: old name
        modes = modes_alias or modes  # --modes: the old name of --mode
        target, options = _request(
            url, model, run_dir, uuid_prefix, modes, load_format, timeout, api_key, test_knob
        )
        report = run_with_progress(
            check.TITLE,
            lambda progress: check.run(target, options, progress),
            tui=tui,
            as_json=as_json,
        )
        _conclude(report, as_json)


def _request(
    url: str | None,
    model: str | None,
    run_dir: Path | None,
    uuid_prefix: str,
    modes: str,
    load_format: str,
    timeout: float,
    api_key: str | None,
    test_knob: list[str] | None,
) -> tuple[Target, check.Options]:
    """The flags checked (BadInput, exit 2): (target, options) for the check."""
    from opsctl.checks import mm_uuid as check
    from opsctl.checks.target import EngineSpec, url_or_model
    from opsctl.commands.options import parse_knobs

    url = url_or_model(url, model)
    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not mode_list or any(m not in MODES for m in mode_list):
        raise BadInput(f"--mode takes caches-off and/or caches-on, not {modes!r}")
    check_load_format(load_format)
    if not uuid_prefix or any(c.isspace() for c in uuid_prefix):
        raise BadInput("--uuid-prefix must be a non-empty string without spaces")
    if run_dir is not None and not url:
        raise BadInput("--run goes with a URL")
    knobs = parse_knobs(test_knob, url=url)
    options = check.Options(uuid_prefix, mode_list, run_dir, timeout)
    if url:
        return url_target(url, api_key, timeout), options
    return EngineSpec(model=model, load_format=load_format, knobs=tuple(knobs.items())), options


def _conclude(report: check.Report, as_json: bool) -> None:
    """Say the result, print the report, map the verdict to the exit code."""
    from opsctl import output
    from opsctl.ui import render_mm_uuid

    output.info(f"mm-uuid check: {report.verdict}")
    if report.knob_warning:
        output.warn(report.knob_warning)
    doc = report.to_dict()
    output.emit(doc, as_json=as_json, render=render_mm_uuid.render(doc))
    if report.verdict != "pass":
        raise CheckFailed(
            f"{len(report.failed_items)} multimodal item(s) did not reach the engine core "
            "as expected"
        )
