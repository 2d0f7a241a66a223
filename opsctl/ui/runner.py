"""The one Textual runner: every opsctl app runs in this terminal through :func:`run_app`.

Serve's dashboard, the diag panels, certify and the console all run under the engine
lifetime policy (opsctl.engine.lifetime).

A stop signal (SIGINT, SIGTERM, SIGHUP) arrives in the main thread, where the app's
event loop runs; the handler may not touch the app directly. The runner therefore owns
the loop (Textual's public ``App.run(loop=...)``), calls the app's ``on_stop_signal``
hook (cancel work, stop engines: it must not block) and schedules ``app.exit`` with
``loop.call_soon_threadsafe``, which also wakes a loop asleep in ``select``. After the
app has exited, :func:`opsctl.engine.lifetime.raise_if_received` raises the signal as
``Terminated`` (exit 130 for SIGINT).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from textual.app import App


def run_app(app: App, run: Callable[[App], Any] | None = None) -> None:
    """Run ``app`` in this terminal until it exits; a stop signal exits it, then is raised.

    ``run``: how to run it, for tests driving it headless. A stop signal calls
    ``app.on_stop_signal()`` (when the app has one) and exits the app; the signal is raised
    once the app is gone.
    """
    from opsctl.engine import lifetime

    loop = asyncio.new_event_loop()

    def exit_from_signal() -> None:
        hook = getattr(app, "on_stop_signal", None)
        if hook is not None:
            hook()
        loop.call_soon_threadsafe(app.exit)

    try:
        with lifetime.tui_app(exit_from_signal):
            if run is None:
                app.run(loop=loop)
            else:
                run(app)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
    lifetime.raise_if_received()
