"""Thin entry point: imports the CLI lazily, maps errors to exit codes, Ctrl-C -> 130.

The engine lifetime policy (opsctl.engine.lifetime) is installed here, for the real
process only: SIGINT, SIGTERM and SIGHUP stop every engine this process started, in
order, whichever command is running.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run opsctl under the lifetime policy; return the exit code (130 on Ctrl-C)."""
    from opsctl.engine import lifetime
    from opsctl.exit_codes import ExitCode

    lifetime.install()
    try:
        from opsctl.cli import run

        return run(argv)
    except KeyboardInterrupt:
        print("opsctl: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    finally:
        from opsctl.engine.registry import process_engines

        process_engines().stop_all()  # whatever a command left running (none, normally)


if __name__ == "__main__":
    sys.exit(main())
