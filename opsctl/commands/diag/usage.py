"""`opsctl diag usage`: verify /score and /rerank ``usage`` against an independent count
of the engine inputs (the check itself: opsctl.checks.usage).

Exit 1 on any mismatch, 2 for bad input or a generative model, 3 unreachable, 4 when the
server does not answer within --timeout; verdict "unverified" (the expected count cannot
be derived) is exit 0 with a warning on stderr, never a mismatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import (
    api_key_option,
    duration_option,
    epilog,
    json_option,
    test_knob_option,
    tui_option,
    url_argument,
    url_target,
)
from opsctl.domain.weights import LOAD_FORMAT_HELP, check_load_format
from opsctl.errors import BadInput, CheckFailed

if TYPE_CHECKING:
    from opsctl.checks import usage as check
    from opsctl.checks.target import Target


def register(app: typer.Typer) -> None:
    @app.command(
        "usage",
        short_help="/score and /rerank usage against the engine inputs.",
        epilog=epilog(
            "opsctl diag usage --model tiny-reranker",
            "opsctl diag usage 127.0.0.1:8000 --json",
            "opsctl diag usage http://127.0.0.1:8000 --timeout 2m --no-tui",
        ),
    )
    def usage(
        url: str | None = url_argument(),
        model: str | None = typer.Option(
            None, "--model", help="start this model (embedded name or directory)"
        ),
        kind: str | None = typer.Option(
            None, "--kind", help="cross-encoder | bi-encoder (default: detect)"
        ),
        load_format: str = typer.Option("auto", "--load-format", help=LOAD_FORMAT_HELP),
        as_json: bool = json_option(),
        tui: bool | None = tui_option(),
        timeout: float = duration_option(
            "60s", "--timeout", help="the longest wait for each HTTP answer (exit 4 past it)"
        ),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Check /score and /rerank usage.prompt_tokens against the engine inputs.

        Exit 1 on a mismatch; verdict "unverified" (exit 0, warning) when the expected
        count cannot be derived."""
        from opsctl.checks import usage as check
        from opsctl.ui.progress import run_with_progress

        target, options = _request(url, model, kind, load_format, timeout, api_key, test_knob)
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
    kind: str | None,
    load_format: str,
    timeout: float,
    api_key: str | None,
    test_knob: list[str] | None,
) -> tuple[Target, check.Options]:
    """The flags checked (BadInput, exit 2): (target, options) for the check."""
    from opsctl.checks import usage as check
    from opsctl.checks.target import EngineSpec, url_or_model
    from opsctl.commands.options import parse_knobs
    from opsctl.domain.usage import KINDS

    if kind is not None and kind not in KINDS:
        raise BadInput(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    check_load_format(load_format)
    if not url and not model:
        raise BadInput(
            "give a server URL or --model NAME",
            hint="e.g. opsctl diag usage --model tiny-reranker",
        )
    url = url_or_model(url, model)
    knobs = parse_knobs(test_knob, url=url)
    if url:
        return url_target(url, api_key, timeout), check.Options(kind, timeout)
    spec = EngineSpec(model=model, load_format=load_format, knobs=tuple(knobs.items()))
    return spec, check.Options(kind, timeout)


def _conclude(report: check.Report, as_json: bool) -> None:
    """Say the result, print the report, map the verdict to the exit code."""
    from opsctl import output
    from opsctl.ui import render_usage

    doc = report.to_dict()
    output.info(f"usage check on {doc['model']} ({doc['kind']}): {report.verdict}")
    if report.knob_warning:
        output.warn(report.knob_warning)
    output.emit(doc, as_json=as_json, render=render_usage.render(doc))
    rows = len(report.rows)
    if report.verdict == "unverified":
        output.warn(
            f"usage NOT verified for {report.count('unverified')} of {rows} request(s): the "
            "expected count could not be derived (unknown pair template); not a mismatch"
        )
    elif report.verdict != "pass":
        raise CheckFailed(
            f"{report.count('fail')} of {rows} usage report(s) differ from the engine-input count"
        )
