"""The shared worker app (opsctl.ui.worker_app) under both its users: ``q`` while the
call runs cancels it at its next event and exits once it has unwound; ``q`` after it is
done exits at once; run_for_report re-raises the call's error and turns a quit without a
report into KeyboardInterrupt."""

from __future__ import annotations

import threading

import pytest

from opsctl.checks import events as ev
from opsctl.ui import worker_app
from opsctl.ui.certify_app import CertifyApp
from opsctl.ui.diag_app import DiagApp
from opsctl.ui.panels.diag import DiagPanel


def endless(started: threading.Event):
    def call(progress: ev.Progress) -> str:
        started.set()
        while True:
            progress(ev.Phase("waiting"))
            threading.Event().wait(0.02)

    return call


@pytest.mark.anyio
@pytest.mark.parametrize("make", [lambda c: DiagApp("diag test", c), lambda c: CertifyApp(c)])
async def test_quit_while_running_cancels_and_waits(make):
    started = threading.Event()
    app = make(endless(started))
    async with app.run_test(size=(120, 30)) as pilot:
        while not started.is_set():
            await pilot.pause(0.05)
        await pilot.press("q")
        while not app.done.is_set():
            await pilot.pause(0.05)
        await pilot.pause(0.5)
    assert isinstance(app.error, worker_app.Cancelled)
    assert app.report is None and app.cancelled.is_set()


@pytest.mark.anyio
async def test_a_failing_call_shows_its_error_in_the_diag_panel():
    def call(progress: ev.Progress) -> str:
        raise ValueError("no such model")

    app = DiagApp("diag test", call)
    async with app.run_test(size=(120, 30)) as pilot:
        while not app.done.is_set():
            await pilot.pause(0.05)
        await pilot.pause()
        panel = app.query_one(DiagPanel)
        assert panel.last["verdict"] == "fail"
        assert panel.last["events"] == ["error: no such model"]
        await pilot.press("q")
    assert isinstance(app.error, ValueError)


def test_run_for_report(monkeypatch):
    monkeypatch.setattr("opsctl.ui.runner.run_app", lambda app: None)
    app = DiagApp("diag test", lambda p: "report")
    app.report = "report"
    assert worker_app.run_for_report(app) == "report"
    app.error = ValueError("boom")
    with pytest.raises(ValueError):
        worker_app.run_for_report(app)
    app.error, app.report = None, None
    with pytest.raises(KeyboardInterrupt):
        worker_app.run_for_report(app)
