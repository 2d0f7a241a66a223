"""Root Typer app: one sub-app per command group.

Importing this module must stay cheap: no torch, no vllm (a test checks sys.modules).
Command modules import heavy dependencies inside their functions.
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from opsctl.errors import OpsctlError
from opsctl.exit_codes import ExitCode


def report_error(err: OpsctlError) -> None:
    print(f"opsctl: error: {err.message}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)


class OpsctlGroup(TyperGroup):
    """Maps typed errors to exit codes in one place (also under Typer's CliRunner)."""

    def invoke(self, ctx):  # type: ignore[override]
        before = _live_engines()
        try:
            return super().invoke(ctx)
        except OpsctlError as err:
            report_error(err)
            raise typer.Exit(int(err.exit_code)) from None
        except KeyboardInterrupt as exc:
            why = f" ({exc.args[0]})" if exc.args else ""
            print(f"opsctl: interrupted{why}", file=sys.stderr)
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        finally:
            # engines this command started, by any thread, never outlive it (engines the
            # calling process had before, e.g. a test's shared engine, are not ours)
            for server in _live_engines() - before:
                server.stop()


def _live_engines() -> set:
    server = sys.modules.get("opsctl.engine.server")
    return set(server._LIVE) if server is not None else set()


def build_app() -> typer.Typer:
    from opsctl.commands import (
        certify,
        console,
        diag,
        engram,
        models,
        patches,
        runs,
        serve,
        status,
    )

    app = typer.Typer(
        cls=OpsctlGroup,
        name="opsctl",
        help="Operator's command line and dashboard for vLLM.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    for module in (serve, status, patches, models, engram, diag, runs, console, certify):
        module.register(app)
    return app


app = build_app()


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (usage errors 2, typed errors mapped above)."""
    try:
        app(args=argv, prog_name="opsctl")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    return 0
