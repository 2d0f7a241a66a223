"""Serve state machine: starting -> loading -> ready, or dead / stopped."""

from __future__ import annotations

from opsctl.domain.serverlog import LoadProgress

STARTING, LOADING, READY, DEAD, STOPPED = "starting", "loading", "ready", "dead", "stopped"


def derive_state(
    exit_code: int | None, healthy: bool, progress: LoadProgress, stopping: bool = False
) -> str:
    """The served engine's state: stopped or dead after exit, else ready, loading or starting."""
    if exit_code is not None:
        return STOPPED if stopping else DEAD
    if healthy:
        return READY
    if progress.step >= 2:  # the engine core has begun initialising
        return LOADING
    return STARTING
