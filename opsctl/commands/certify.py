"""`opsctl certify [URL | --model NAME|DIR]`: every applicable check in one command, with
the fewest engine starts, for people (summary table) and CI (--json, --junit, --sarif).
The certification itself: opsctl.checks.certify.

Exit 0: every applicable check passed; 1: any failed; 2: usage (also --checks naming
a check that cannot run); 3: unreachable; 4: timeout. Report files are written
whatever the verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import api_key_option, test_knob_option
from opsctl.errors import BadInput, CheckFailed, OpsTimeout

if TYPE_CHECKING:
    from opsctl.checks.certify import CertifyReport


def register(app: typer.Typer) -> None:
    @app.command("certify")
    def certify(
        url: str | None = typer.Argument(None, help="base URL of a running vLLM server"),
        model: str | None = typer.Option(
            None, "--model", help="start this model (embedded name or directory)"
        ),
        checks: str | None = typer.Option(None, "--checks", help="only these checks (a,b,...)"),
        skip: str | None = typer.Option(None, "--skip", help="skip these checks (a,b,...)"),
        junit: Path | None = typer.Option(None, "--junit", help="write JUnit XML here"),
        sarif: Path | None = typer.Option(None, "--sarif", help="write SARIF 2.1.0 here"),
        as_json: bool = typer.Option(False, "--json", help="print the JSON report"),
        tui: bool | None = typer.Option(None, "--tui/--no-tui", help="live list of checks"),
        timeout: float = typer.Option(
            300.0, "--timeout", help="seconds for an engine start or one answer (exit 4)"
        ),
        load_format: str = typer.Option("auto", "--load-format", help="auto or dummy"),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Certify a vLLM build or deployment: run every applicable check.

        Checks: liveness, patches, engram, usage, invariance, mm-uuid, kv-fail,
        shutdown; those that do not apply are reported as skipped with the reason."""
        from opsctl.checks import certify as check
        from opsctl.domain.certify import parse_list

        try:
            only, skipped = parse_list(checks, "--checks"), parse_list(skip, "--skip")
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        target = _target(url, model, load_format, api_key, test_knob)
        options = check.Options(only, skipped, timeout)
        report = _run(lambda progress: check.run(target, options, progress), tui, as_json)
        _write(report, junit, sarif)
        _conclude(report, as_json)


def _target(url, model, load_format: str, api_key, test_knob):
    from opsctl.checks.target import EngineSpec, UrlTarget
    from opsctl.commands.options import parse_knobs

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
        return UrlTarget(url, api_key)
    return EngineSpec(
        model=model, load_format=load_format, knobs=tuple(knobs.items()), api_key=api_key
    )


def _run(call, tui: bool | None, as_json: bool) -> CertifyReport:
    from opsctl.output import want_tui
    from opsctl.ui.progress import run_with_progress

    if tui and want_tui(True, as_json):
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
    if junit is not None:
        junit.write_text(junit_xml([doc]))
        output.info(f"JUnit XML written to {junit}", markup=False)
    if sarif is not None:
        model_path = doc["fingerprint"]["model"].get("path")
        config = str(Path(model_path, "config.json").resolve()) if model_path else None
        artifact = artifact_for(os.getcwd(), config, str(sarif.resolve()))
        sarif.write_text(json.dumps(sarif_log(doc, artifact), indent=2, default=str) + "\n")
        output.info(f"SARIF written to {sarif}", markup=False)


def _conclude(report: CertifyReport, as_json: bool) -> None:
    from opsctl import output
    from opsctl.ui import render_certify

    doc = report.to_dict()
    output.emit(doc, as_json=as_json, render=render_certify.render(doc))
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
