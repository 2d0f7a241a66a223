"""The one deadline wait of the suite: poll a condition until it holds or the deadline
passes (never a sleep or a poll count standing in for a condition)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    cond: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    show: Callable[[], object] = lambda: "",
    every: float = 0.05,
) -> Any:
    """Return cond()'s first true value; fail with ``what`` and ``show()`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, (
            f"timed out after {timeout:g} s waiting for {what}: {show()}"
        )
        time.sleep(every)
