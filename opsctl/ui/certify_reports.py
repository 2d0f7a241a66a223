"""``opsctl certify``'s view: progress, the JUnit and SARIF reports, summary and exit code.

The run shows under progress (stderr or a live panel). The reports' paths are checked before any
work, so bad input writes nothing; they are written whatever the verdict once the work ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout

ERRORS = {1: CheckFailed, 2: BadInput, 3: EngineUnreachable, 4: OpsTimeout}


def writable(path: Path | None, flag: str) -> None:
    """Checked (its directory made, as pytest's --junitxml does) before any engine start."""
    if path is not None and path.is_dir():
        raise BadInput(f"{flag} {path} is a directory; give a file name")
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"{flag} {path}: cannot create its directory ({exc.strerror})") from None


def write(docs: list[Mapping[str, Any]], junit: Path | None, sarif: Path | None) -> None:
    """Write ONE JUnit file (a testsuite per document) and ONE SARIF log (a run per document).

    The documents: one certify document, or a fleet's targets (each has a ``name``).
    """
    from opsctl.ui.render_junit import junit_xml
    from opsctl.ui.render_sarif import sarif_text

    texts: list[tuple[Path | None, str, Callable[[Path], str]]] = [
        (junit, "JUnit XML", lambda _: junit_xml(docs)),
        (sarif, "SARIF", lambda path: sarif_text(docs, str(Path.cwd()), str(path.resolve()))),
    ]
    for path, what, text in texts:
        if path is None:
            continue
        try:
            path.write_text(text(path))
        except OSError as exc:
            raise CheckFailed(f"cannot write the report {path}: {exc.strerror}") from None
        from opsctl import output

        output.info(f"{what} written to {path}", markup=False)


def run_view(call, tui: bool | None, as_json: bool, fleet: bool = False):
    """Run ``call`` under certify's view: the dashboard, or progress lines / the live panel."""
    from opsctl.output import want_tui
    from opsctl.ui.progress import run_with_progress

    if not fleet and not as_json and want_tui(tui, as_json):  # --json: no dashboard
        from opsctl.ui.certify_app import run_tui

        return run_tui(call)  # a fleet: the events in the plain live panel (--tui)
    return run_with_progress("certify", call, tui=fleet and tui, as_json=as_json)


def conclude(doc: dict, report, as_json: bool, fleet: bool = False) -> None:
    """Print the summary (or the JSON document), then exit with the certify exit code."""
    from opsctl import output
    from opsctl.domain import certify, certify_fleet
    from opsctl.ui import render_certify as r

    output.emit(doc, as_json=as_json, render=(r.render_fleet if fleet else r.render)(doc))
    if report.stop is not None:
        raise report.stop  # exit 130, the report written
    code, line = (certify_fleet if fleet else certify).conclusion(doc)
    if code == 0:
        output.info(line, markup=False)
        return
    raise ERRORS.get(code, CheckFailed)(line, hint=getattr(report, "hint", None))
