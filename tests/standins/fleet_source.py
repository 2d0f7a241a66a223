"""A stand-in FleetSource base: fixed views, nothing to start, poll, pause or wait for.

Subclasses give ``collect()`` and ``series()``; the console app (tests/ui, the GPU
console tests) reads them like a live source.
"""

from __future__ import annotations


class FixedSource:
    """The no-op half of a FleetSource: start, close, refresh and pause do nothing."""

    def start(self) -> None:
        """Nothing to start."""

    def close(self) -> None:
        """Nothing to stop."""

    def refresh(self) -> None:
        """Nothing to poll."""

    def set_paused(self, paused: bool) -> None:
        """Nothing to pause."""

    def wait_settled(self, timeout: float) -> bool:
        """Fixed views are settled at once."""
        return True
