"""The one deadline wait of the suite: poll a condition until it holds or the deadline
passes (never a sleep or a poll count standing in for a condition)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# a condition is looked at no more than about half the time: after a look that took
# long (a CLI it runs: ~1 s of a core each; a scrape of a busy server) the wait is as
# long as the look, up to this. Back-to-back looks starved what they waited for on 2
# cores (the engine, its API server answering /metrics, the console under test)
MAX_PAUSE_S = 2.0


def wait_until(
    cond: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    show: Callable[[], object] = lambda: "",
    every: float = 0.05,
) -> Any:
    """Return cond()'s first true value; fail with ``what`` and ``show()`` at the deadline.

    Between looks: ``every`` seconds, or as long as the last look took (at most
    ``MAX_PAUSE_S``) when that was longer."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        value = cond()
        if value:
            return value
        now = time.monotonic()
        assert now < deadline, f"timed out after {timeout:g} s waiting for {what}: {show()}"
        time.sleep(max(every, min(now - began, MAX_PAUSE_S)))
