"""`opsctl certify [URL | --model NAME|DIR]`: every applicable check in one command, with
the fewest engine starts, for people (summary table) and CI (--json, --junit, --sarif).
The certification itself: opsctl.checks.certify.

The report (--json on stdout, --junit and --sarif files) is written whatever happens
once the command line is valid, like pytest's --junitxml: no vLLM server answered
(one failed ``liveness`` case, exit 3), a check crashed (its ``error`` case, exit 1), a
check timed out (exit 4), an engine certify started never came up, certify itself
failed. Only bad input (exit 2: an invalid URL, an unknown model or check name, a bad
flag) writes no report: nothing was certified and the command line must be fixed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import (
    api_key_option,
    duration_option,
    epilog,
    json_option,
    test_knob_option,
    tui_option,
)
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout

if TYPE_CHECKING:
    from opsctl.checks.certify import CertifyReport

HELP = """Certify a vLLM build or deployment: run every applicable check.

Checks: liveness, patches, engram, usage, invariance, mm-uuid, kv-fail, shutdown; those
that do not apply are reported as skipped with the reason.

The report (--json, --junit, --sarif) is always written, whatever the verdict: no vLLM
server answering is one failed liveness case (exit 3), a check that crashes is an error
case (exit 1), a timeout exit 4. Bad input (exit 2: an invalid URL, an unknown model or
check) writes no report."""


def register(app: typer.Typer) -> None:
    @app.command(
        "certify",
        help=HELP,
        short_help="run every applicable check; JSON, JUnit and SARIF reports for CI",
        epilog=epilog(
            "opsctl certify http://127.0.0.1:8000 --junit report.xml --sarif report.sarif",
            "opsctl certify --model tiny-llama --skip kv-fail",
            "opsctl certify 127.0.0.1:8000 --checks liveness,usage --json",
        ),
    )
    def certify(
        url: str | None = typer.Argument(
            None,
            metavar="URL",
            help="base URL of a running vLLM server (HOST:PORT means http://HOST:PORT)",
        ),
        model: str | None = typer.Option(
            None,
            "--model",
            metavar="NAME|DIR",
            help="start this model instead (embedded name or directory)",
        ),
        checks: str | None = typer.Option(
            None, "--checks", metavar="LIST", help="only these checks (a,b,...)"
        ),
        skip: str | None = typer.Option(
            None, "--skip", metavar="LIST", help="skip these checks (a,b,...)"
        ),
        junit: Path | None = typer.Option(
            None,
            "--junit",
            metavar="FILE",
            help="write JUnit XML here (always, whatever the verdict)",
        ),
        sarif: Path | None = typer.Option(
            None,
            "--sarif",
            metavar="FILE",
            help="write SARIF 2.1.0 here (always, whatever the verdict)",
        ),
        as_json: bool = json_option(),
        tui: bool | None = tui_option(
            help="live list of checks on a terminal (--no-tui: plain progress on stderr)"
        ),
        timeout: float = duration_option(
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
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        from opsctl.checks import certify as check
        from opsctl.domain.certify import parse_list

        try:
            only, skipped = parse_list(checks, "--checks"), parse_list(skip, "--skip")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        target = _target(url, model, load_format, api_key, test_knob)
        options = check.Options(only, skipped, timeout)
        for path, flag in ((junit, "--junit"), (sarif, "--sarif")):
            _writable(path, flag)
        started = time.monotonic()
        try:
            report = _run(lambda progress: check.run(target, options, progress), tui, as_json)
        except (BadInput, KeyboardInterrupt):
            raise  # bad input: no report (the command line must change); interrupted: 130
        except Exception as exc:  # certify itself failed: CI still gets its report
            report = check.not_reached(target, exc, time.monotonic() - started)
        _write(report, junit, sarif)
        _conclude(report, as_json)


def _target(url, model, load_format: str, api_key, test_knob):
    from opsctl.checks.target import EngineSpec, UrlTarget
    from opsctl.commands.options import parse_knobs
    from opsctl.domain.urls import normalise_url

    if not url and not model:
        raise BadInput(
            "give a server URL or --model NAME|DIR", hint="e.g. opsctl certify --model tiny-llama"
        )
    if url and model:
        raise BadInput("give either a URL or --model, not both")
    if load_format not in ("auto", "dummy", "safetensors"):
        raise BadInput(f"--load-format must be auto, safetensors or dummy, not {load_format!r}")
    knobs = parse_knobs(test_knob, url=url)
    if url:
        return UrlTarget(normalise_url(url), api_key)
    return EngineSpec(
        model=model, load_format=load_format, knobs=tuple(knobs.items()), api_key=api_key
    )


def _writable(path: Path | None, flag: str) -> None:
    """A report path certify can write (its directory is made, like pytest's
    --junitxml); checked before anything runs, so a typo costs no engine start."""
    if path is None:
        return
    if path.is_dir():
        raise BadInput(f"{flag} {path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot create its directory ({exc.strerror})") from None


def _run(call, tui: bool | None, as_json: bool) -> CertifyReport:
    from opsctl.output import want_tui
    from opsctl.ui.progress import run_with_progress

    if want_tui(tui, as_json):
        from opsctl.ui.certify_app import run_tui

        return run_tui(call)
    return run_with_progress("certify", call, tui=False, as_json=as_json)


def _write(report: CertifyReport, junit: Path | None, sarif: Path | None) -> None:
    import json
    import os

    from opsctl import output
    from opsctl.domain.junit import junit_xml
    from opsctl.domain.sarif import artifact_for, sarif_log

    doc = report.to_dict()
    try:
        if junit is not None:
            junit.write_text(junit_xml([doc]))
            output.info(f"JUnit XML written to {junit}", markup=False)
        if sarif is not None:
            model_path = doc["fingerprint"]["model"].get("path")
            config = str(Path(model_path, "config.json").resolve()) if model_path else None
            artifact = artifact_for(os.getcwd(), config, str(sarif.resolve()))
            sarif.write_text(json.dumps(sarif_log(doc, artifact), indent=2, default=str) + "\n")
            output.info(f"SARIF written to {sarif}", markup=False)
    except OSError as exc:
        raise CheckFailed(f"cannot write the report: {exc.filename}: {exc.strerror}") from None


def _conclude(report: CertifyReport, as_json: bool) -> None:
    from opsctl import output
    from opsctl.domain import certify as dom
    from opsctl.ui import render_certify

    doc = report.to_dict()
    output.emit(doc, as_json=as_json, render=render_certify.render(doc))
    if report.stop is not None:
        raise report.stop  # exit 130, the report written
    if doc["state"] == dom.UNREACHABLE:
        raise EngineUnreachable(doc["error"], hint=report.hint)
    if doc["state"] == dom.CRASHED:
        raise CheckFailed(doc["error"])
    if report.refused:
        raise BadInput(f"asked for but cannot run here: {', '.join(report.refused)}")
    s = doc["summary"]
    line = (
        f"{s['run']} run, {s['pass'] + s['unverified']} passed, {s['fail']} failed, "
        f"{s['error']} errored, {s['skipped']} skipped, {s['engine_starts']} engine start(s)"
    )
    if report.exit_code == 4:
        raise OpsTimeout(f"certify: timed out ({line})")
    if report.exit_code != 0:
        failed = [r["check"] for r in report.results if r["verdict"] in ("fail", "error")]
        raise CheckFailed(f"certify failed: {', '.join(failed)} ({line})")
    output.info(f"certify passed: {line}", markup=False)
