"""Draw a check's progress events: on stderr for the plain CLI, in a live panel with ``--tui``.

Both are views over the same :mod:`opsctl.checks.events` a check emits.
``run_with_progress(title, call, tui=..., as_json=...)`` runs ``call(progress)`` and
returns what it returns (the check's report).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from opsctl.checks import events as ev

R = TypeVar("R")


def stderr_progress(title: str) -> ev.Progress:
    """Phase changes and log lines on stderr (stdout stays for results)."""
    from opsctl import output

    state: dict[str, str | None] = {"phase": None}

    def progress(event: ev.Event) -> None:
        if isinstance(event, ev.Started):
            return  # "starting" says nothing yet (and bad input then stays one line)
        snap = event.snapshot()
        phase = snap.get("phase")
        if phase and phase != state["phase"]:
            state["phase"] = phase
            output.info(f"[{title}] {phase}", markup=False)
        for line in snap.get("events", []):
            output.info(f"  {line}", markup=False)

    return progress


def run_with_progress(
    title: str, call: Callable[[ev.Progress], R], *, tui: bool | None, as_json: bool
) -> R:
    """Run ``call(progress)`` plainly (stderr) or under the live panel; return its result.

    Signals follow the lifetime policy: the panel exits, engines stop, Terminated.
    """
    from opsctl.output import want_tui

    use_tui = want_tui(bool(tui), as_json) if tui else False
    if not use_tui:
        return call(stderr_progress(title))
    from opsctl.ui.diag_app import DiagApp
    from opsctl.ui.worker_app import run_for_report

    return run_for_report(DiagApp(title, call))
