"""A fixed FleetSource for the console UI's tests: nothing to start, poll or wait for."""

from __future__ import annotations

from opsctl.console.source import SourceDefaults


class FixedSource(SourceDefaults):
    """The FleetSource lifecycle of a source whose views never change.

    A subclass gives ``collect`` and ``series``; starting, closing, refreshing and
    pausing do nothing, and it is always settled (the other members: SourceDefaults's).
    """

    def start(self) -> None:
        """Nothing runs in the background."""

    def close(self) -> None:
        """Nothing to stop."""

    def refresh(self) -> None:
        """The views are fixed: nothing to scrape again."""

    def set_paused(self, paused: bool) -> None:
        """Nothing polls, so nothing pauses."""

    def wait_settled(self, timeout: float) -> bool:
        """Always settled: True at once."""
        return True
