"""Thin entry point: imports the CLI lazily, maps errors to exit codes, Ctrl-C -> 130."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from opsctl.exit_codes import ExitCode

    try:
        from opsctl.cli import run

        return run(argv)
    except KeyboardInterrupt:
        print("opsctl: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
