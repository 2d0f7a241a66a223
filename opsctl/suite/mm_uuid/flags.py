"""`opsctl diag mm-uuid`: which identifier each multimodal item reached the engine core with.

The check itself: opsctl.suite.mm_uuid.run.

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

from opsctl.checks.target import url_target
from opsctl.commands.options import RUN_HELP, duration_option, run_path, url_argument
from opsctl.domain.weights import LOAD_FORMAT_HELP, check_load_format
from opsctl.errors import BadInput
from opsctl.suite.mm_uuid.judge import DEFAULT_MODEL, MODES

if TYPE_CHECKING:
    from opsctl.checks.target import Target
    from opsctl.suite.mm_uuid import run as check


def flags(
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
    timeout: float = duration_option(
        "2m", "--timeout", help="the longest wait for each HTTP answer (exit 4 past it)"
    ),
    api_key: str | None = None,
    test_knob: list[str] | None = None,
) -> tuple[Target, check.Options]:
    """Show which multimodal identifier reached the engine core; exit 1 if an explicit UUID was rewritten."""
    from opsctl.checks.target import EngineSpec, url_or_model
    from opsctl.commands.options import parse_knobs
    from opsctl.suite.mm_uuid import run as check

    run_dir = run_path(run) if run is not None else run_dir_alias  # --run-dir: old name
    modes = modes_alias or modes  # --modes: the old name of --mode
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
