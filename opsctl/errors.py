"""Typed errors. Commands raise these; opsctl.__main__ maps them to exit codes.

An error carries one clear line (``message``) and an optional ``hint``.
"""

from __future__ import annotations

from opsctl.exit_codes import ExitCode


class OpsctlError(Exception):
    """An error a command reports as one line (and a hint) with its exit code."""

    exit_code: ExitCode = ExitCode.CHECK_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class CheckFailed(OpsctlError):
    """A verification ran and found a problem (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class EngineDied(OpsctlError):
    """The engine process exited unexpectedly (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class BadInput(OpsctlError):
    """Bad input or usage (exit 2)."""

    exit_code = ExitCode.USAGE


class EngineUnreachable(OpsctlError):
    """No server answered at the given URL (exit 3)."""

    exit_code = ExitCode.UNREACHABLE


class OpsTimeout(OpsctlError):
    """Something did not happen within its time limit (exit 4)."""

    exit_code = ExitCode.TIMEOUT
