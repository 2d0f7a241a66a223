"""`opsctl certify [URL... | --targets FILE | --model NAME|DIR]`: every applicable check.

The checks: opsctl.checks.certify (a fleet: .certify_fleet). Reports are written whatever
happens; bad input writes none."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from opsctl.commands import options as o
from opsctl.domain import check_registry as reg
from opsctl.domain.weights import LOAD_FORMAT_HELP
from opsctl.errors import BadInput

HELP = """Certify a vLLM build or deployment: run every applicable check ({checks}; the
others skipped, why).

The report (--json, --junit, --sarif) is always written, whatever the verdict: no vLLM
server answering is one failed liveness case (exit 3), a check that crashes is an error
case (exit 1), a timeout exit 4, an interrupt exit 130. Bad input (exit 2: an invalid
URL, an unknown model or check) writes no report.

Several URLs or --targets FILE (the console's TOML targets file, keys from api_key_env):
the URL checks on every target at once (--concurrency), each within its deadline
(--timeout); one JUnit file (a testsuite per target), one SARIF log (a run per target),
one JSON document; exit 0 only when every target passed (a dead one fails liveness)."""
EXAMPLES = o.epilog(
    "opsctl certify http://127.0.0.1:8000 --junit report.xml --sarif report.sarif",
    "opsctl certify --model tiny-llama --skip kv-fail",
    "opsctl certify 127.0.0.1:8000 --checks liveness,usage --json",
    "opsctl certify --targets fleet.toml --junit fleet.xml --sarif fleet.sarif --json",
)


def register(app: typer.Typer) -> None:
    """Add ``opsctl certify`` to ``app``."""

    @app.command(
        "certify",
        help=HELP.format(checks=", ".join(reg.names(reg.CERTIFY))),
        short_help="Run every applicable check; JSON, JUnit and SARIF reports for CI.",
        epilog=EXAMPLES,
    )
    def certify(
        urls: list[str] | None = typer.Argument(
            None,
            metavar="URL...",
            help="base URL(s) of running vLLM servers (HOST:PORT means http://HOST:PORT)",
        ),
        model: str | None = typer.Option(
            None, "--model", metavar="NAME|DIR", help="start this model (name or directory)"
        ),
        targets: Path | None = typer.Option(
            None, "--targets", metavar="FILE", help="certify every target of this TOML file"
        ),
        concurrency: int = typer.Option(
            8, "--concurrency", metavar="N", help="a fleet: at most N targets at once"
        ),
        checks: str | None = typer.Option(
            None, "--checks", metavar="LIST", help="only these checks (a,b,...)"
        ),
        skip: str | None = typer.Option(
            None, "--skip", metavar="LIST", help="skip these checks (a,b,...)"
        ),
        junit: Path | None = typer.Option(
            None, "--junit", metavar="FILE", help="write JUnit XML here, whatever happens"
        ),
        sarif: Path | None = typer.Option(
            None, "--sarif", metavar="FILE", help="write SARIF 2.1.0 here, whatever happens"
        ),
        as_json: bool = o.json_option(),
        tui: bool | None = o.tui_option(
            help="live list of checks on a terminal (--no-tui: plain progress on stderr)"
        ),
        timeout: float = o.duration_option(
            "5m",
            "--timeout",
            help="the longest wait for an engine certify starts and for each HTTP answer "
            "(exit 4 past it); a URL with no first answer within it (30s at most) is "
            "unreachable (exit 3); a fleet: each target's deadline",
        ),
        load_format: str = typer.Option(
            "auto",
            "--load-format",
            metavar="FORMAT",
            help=f"with --model: {LOAD_FORMAT_HELP}",
        ),
        tp: int | None = o.rank_option("tp"),
        dp: int | None = o.rank_option("dp"),
        api_key: str | None = o.api_key_option(),
        test_knob: list[str] | None = o.test_knob_option(),
    ) -> None:
        from opsctl.checks import certify as check
        from opsctl.domain.certify import parse_list
        from opsctl.ui.certify_reports import conclude, run_view, write

        try:
            only, skipped = parse_list(checks, "--checks"), parse_list(skip, "--skip")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        urls, run = urls or [], check.Options(only, skipped, timeout)
        knobs = o.parse_knobs(test_knob, url=(urls or [None])[0])
        if targets is None and len(urls) < 2:
            return _single((urls or [None])[0], model, load_format, api_key, knobs, run,
                           (junit, sarif, tui, as_json), (tp, dp))  # fmt: skip
        engine_flags = bool(knobs) or tp is not None or dp is not None
        call = _fleet(urls, targets, model, engine_flags, api_key, run, concurrency)
        _writable(junit, sarif)
        report = run_view(call, tui, as_json, fleet=True)
        write(report.docs(), junit, sarif)
        conclude(report.to_dict(), report, as_json, fleet=True)


def _writable(junit: Path | None, sarif: Path | None) -> None:
    from opsctl.ui.certify_reports import writable

    for path, flag in ((junit, "--junit"), (sarif, "--sarif")):
        writable(path, flag)


def _single(url, model, load_format, api_key, knobs, run, out, ranks) -> None:
    from opsctl.checks import certify as check
    from opsctl.checks import certify_plan as planning
    from opsctl.checks.target import with_ranks
    from opsctl.ui.certify_reports import conclude, run_view, write

    junit, sarif, tui, as_json = out
    target = with_ranks(planning.target_of(url, model, load_format, api_key, knobs), *ranks)
    _writable(junit, sarif)
    started = time.monotonic()
    try:
        report = run_view(lambda progress: check.run(target, run, progress), tui, as_json)
    except (BadInput, KeyboardInterrupt):
        raise  # bad input: no report (the command line must change); interrupted: 130
    except Exception as exc:  # certify itself failed: CI still gets its report
        report = check.not_reached(target, exc, time.monotonic() - started)
    write([report.to_dict()], junit, sarif)
    conclude(report.to_dict(), report, as_json)


def _fleet(urls, targets, model, engine_flags, api_key, run, concurrency):
    """The fleet's library call, its input checked (BadInput: exit 2, nothing written)."""
    from os import environ

    from opsctl.checks import certify_fleet as fleet
    from opsctl.console import targets as tg

    if model is not None or engine_flags:
        raise BadInput(
            "--model, --tp, --dp and --test-knob certify one engine, not URLs or --targets"
        )
    listed = (tg.from_targets_file(targets) if targets else []) + tg.from_urls(urls)
    resolved, options = fleet.resolve(listed, api_key, environ), fleet.Options(run, concurrency)
    return lambda progress: fleet.run(resolved, options, progress)
