"""A diag command's live TUI driven to its end, for the --tui tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def run_diag_app(
    title: str, run: Callable, size: tuple[int, int], polls: int
) -> tuple[dict, object]:
    """Run ``run(progress)`` in a DiagApp headless until done; (the panel's last view, the app).

    The app is polled every 0.05 s, at most ``polls`` times, then given 0.1 s to draw.
    """
    from opsctl.ui.diag_app import DiagApp
    from opsctl.ui.panels.diag import DiagPanel

    async def go() -> tuple[dict, DiagApp]:
        app = DiagApp(title, run)
        async with app.run_test(size=size) as pilot:
            for _ in range(polls):
                await pilot.pause(0.05)
                if app.done.is_set():
                    break
            await pilot.pause(0.1)
            return app.query_one(DiagPanel).last, app

    return asyncio.run(go())
