"""The one place exit codes are defined (see docs/cli.md: exit codes)."""

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code opsctl returns."""

    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    TIMEOUT = 4
    INTERRUPTED = 130
