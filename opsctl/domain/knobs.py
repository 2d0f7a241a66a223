"""Test knobs as operators see them (pure): the warning line when an engine honoured one.

Every diag report, its live panel and the serve dashboard put that line on top.
"""

from __future__ import annotations


def warning(knobs: dict[str, str]) -> str | None:
    """The warning for active test knobs, None when there are none."""
    if not knobs:
        return None
    named = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    return f"TEST KNOBS active in this engine ({named}): its behaviour is altered on purpose"
