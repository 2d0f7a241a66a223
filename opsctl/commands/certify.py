"""`opsctl certify [URL | --model NAME|DIR]` (opsctl.checks.certify): the report is
written whatever happens once the command line is valid (HELP); bad input writes none."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opsctl.commands import options as o
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout

ERRORS = {1: CheckFailed, 2: BadInput, 3: EngineUnreachable, 4: OpsTimeout}

if TYPE_CHECKING:  # pragma: no cover
    from opsctl.checks.certify import CertifyReport

HELP = """Certify a vLLM build or deployment: run every applicable check (liveness,
patches, engram, usage, invariance, mm-uuid, kv-fail, shutdown; the others skipped, why).

The report (--json, --junit, --sarif) is always written, whatever the verdict: no vLLM
server answering is one failed liveness case (exit 3), a check that crashes is an error
case (exit 1), a timeout exit 4, an interrupt exit 130. Bad input (exit 2: an invalid
URL, an unknown model or check) writes no report."""
EXAMPLES = o.epilog(
    "opsctl certify http://127.0.0.1:8000 --junit report.xml --sarif report.sarif",
    "opsctl certify --model tiny-llama --skip kv-fail",
    "opsctl certify 127.0.0.1:8000 --checks liveness,usage --json",
)


def register(app: typer.Typer) -> None:
    @app.command(
        "certify",
        help=HELP,
        short_help="run every applicable check; JSON, JUnit and SARIF reports for CI",
        epilog=EXAMPLES,
    )
    def certify(
        url: str | None = typer.Argument(
            None,
            metavar="URL",
            help="base URL of a running vLLM server (HOST:PORT means http://HOST:PORT)",
        ),
        model: str | None = typer.Option(
            None, "--model", metavar="NAME|DIR", help="start this model (name or directory)"
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
            "unreachable (exit 3)",
        ),
        load_format: str = typer.Option(
            "auto",
            "--load-format",
            metavar="FORMAT",
            help="with --model: auto, safetensors or dummy (random weights)",
        ),
        api_key: str | None = o.api_key_option(),
        test_knob: list[str] | None = o.test_knob_option(),
    ) -> None:
        from opsctl.checks import certify as check
        from opsctl.checks import certify_plan as planning
        from opsctl.domain.certify import parse_list

        try:
            only, skipped = parse_list(checks, "--checks"), parse_list(skip, "--skip")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        knobs = o.parse_knobs(test_knob, url=url)
        target = planning.target_of(url, model, load_format, api_key, knobs)
        run = check.Options(only, skipped, timeout)
        for path, flag in ((junit, "--junit"), (sarif, "--sarif")):
            _writable(path, flag)
        started = time.monotonic()
        try:
            report = _run(lambda progress: check.run(target, run, progress), tui, as_json)
        except (BadInput, KeyboardInterrupt):
            raise  # bad input: no report (the command line must change); interrupted: 130
        except Exception as exc:  # certify itself failed: CI still gets its report
            report = check.not_reached(target, exc, time.monotonic() - started)
        _write(report, junit, sarif)
        _conclude(report, as_json)


def _writable(path: Path | None, flag: str) -> None:
    """Checked (its directory made, as pytest's --junitxml does) before any engine start."""
    if path is not None and path.is_dir():
        raise BadInput(f"{flag} {path} is a directory; give a file name")
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot create its directory ({exc.strerror})") from None


def _run(call, tui: bool | None, as_json: bool) -> CertifyReport:
    from opsctl.output import want_tui
    from opsctl.ui.progress import run_with_progress

    if not as_json and want_tui(tui, as_json):  # --json: no dashboard (docs/cli.md)
        from opsctl.ui.certify_app import run_tui

        return run_tui(call)
    return run_with_progress("certify", call, tui=False, as_json=as_json)


def _write(report: CertifyReport, junit: Path | None, sarif: Path | None) -> None:
    from opsctl import output
    from opsctl.domain.junit import junit_xml
    from opsctl.domain.sarif import sarif_text

    doc = report.to_dict()
    texts = [(junit, "JUnit XML", lambda: junit_xml([doc]))]
    texts.append((sarif, "SARIF", lambda: sarif_text(doc, str(Path.cwd()), str(sarif.resolve()))))
    for path, what, text in texts:
        if path is None:
            continue
        try:
            path.write_text(text())
        except OSError as exc:
            raise CheckFailed(f"cannot write the report {path}: {exc.strerror}") from None
        output.info(f"{what} written to {path}", markup=False)


def _conclude(report: CertifyReport, as_json: bool) -> None:
    from opsctl import output
    from opsctl.domain.certify import conclusion
    from opsctl.ui import render_certify

    doc = report.to_dict()
    output.emit(doc, as_json=as_json, render=render_certify.render(doc))
    if report.stop is not None:
        raise report.stop  # exit 130, the report written
    code, line = conclusion(doc)
    if code == 0:
        output.info(line, markup=False)
        return
    raise ERRORS.get(code, CheckFailed)(line, hint=report.hint)
