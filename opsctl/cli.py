"""Root Typer app: one sub-app per command group.

Importing this module must stay cheap: no torch, no vllm (a test checks sys.modules).
Command modules import heavy dependencies inside their functions.

One place for the CLI contract (docs/cli.md): typed errors become exit codes here, a
usage error is one ``opsctl: error:`` line (plus a ``hint:`` line) with exit 2, ``opsctl``
alone prints its help on stdout (exit 0), and ``--version`` reads the package metadata.
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from opsctl.errors import OpsctlError

try:  # Typer >= 0.17 vendors click; its exceptions are the ones raised
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - an older Typer on plain click
    from click import exceptions as click_exc  # type: ignore[no-redef]
from opsctl.exit_codes import ExitCode


def _plain_usage_name(self) -> str:
    """A positional in the usage line as POSIX usage writes it: ``URL`` when required,
    ``[MODEL]`` when optional, ``...`` when repeated (Typer writes ``{URL}``)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


if hasattr(typer.core.TyperArgument, "_usage_display_name"):  # Typer >= 0.17
    typer.core.TyperArgument._usage_display_name = _plain_usage_name


def _option_value_name(self, ctx) -> str | None:
    """An option's value in help by its name (``--port PORT``, ``--api-key API_KEY``),
    or its metavar (``DURATION``), never Typer's Python type (``<int>``, ``<str>``)."""
    if self.metavar is not None:
        return self.metavar
    name = (self.name or "value").upper()
    return name + ("..." if self.nargs != 1 else "")


def _no_argument_type(self, ctx) -> None:
    """A positional in help is its name alone (``URL``), not ``URL <list[str]>``."""
    return None


if hasattr(typer.core.TyperOption, "display_type_rich"):  # Typer >= 0.20 shows types
    typer.core.TyperOption.display_type_rich = _option_value_name
    typer.core.TyperArgument.display_type_rich = _no_argument_type


def report_error(err: OpsctlError) -> None:
    print(f"opsctl: error: {err.message}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)


def _usage_error(err: click_exc.UsageError) -> int:
    """A click usage error as one line plus a hint naming the command's --help."""
    message = " ".join(err.format_message().split())
    param = getattr(err, "param", None)
    if isinstance(err, click_exc.BadParameter) and param is not None and err.param_hint is None:
        flag = max(param.opts, key=len) if param.opts else (param.human_readable_name or "")
        message = f"{flag}: {' '.join(str(err.message).split())}"  # "--timeout: must be ..."
    print(f"opsctl: error: {message}", file=sys.stderr)
    if err.ctx is not None:
        print(f"hint: see '{err.ctx.command_path} --help'", file=sys.stderr)
    return int(ExitCode.USAGE)


class OpsctlGroup(TyperGroup):
    """Maps typed errors to exit codes in one place (also under Typer's CliRunner)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            code = rv if isinstance(rv, int) else 0
        except click_exc.NoArgsIsHelpError as err:  # a group without its command
            typer.echo(err.ctx.get_help() if err.ctx else "")
            code = 0
        except click_exc.UsageError as err:
            code = _usage_error(err)
        except click_exc.ClickException as err:
            err.show()
            code = err.exit_code
        except typer.Abort:
            print("opsctl: interrupted", file=sys.stderr)
            code = int(ExitCode.INTERRUPTED)
        if not standalone_mode:
            return code
        sys.exit(code)

    def invoke(self, ctx):  # type: ignore[override]
        before = _live_engines()
        argv = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        printed = _json_printed()
        try:
            return super().invoke(ctx)
        except OpsctlError as err:
            if _json_printed() == printed:  # this command printed no document of its own
                _error_document(argv, err)
            report_error(err)
            raise typer.Exit(int(err.exit_code)) from None
        except KeyboardInterrupt as exc:
            why = f" ({exc.args[0]})" if exc.args else ""
            if _json_printed() == printed:
                interrupted = OpsctlError(f"interrupted{why}")
                interrupted.exit_code = ExitCode.INTERRUPTED
                _error_document(argv, interrupted)
            print(f"opsctl: interrupted{why}", file=sys.stderr)
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        finally:
            # engines this command started, by any thread, never outlive it (engines the
            # calling process had before, e.g. a test's shared engine, are not ours)
            for server in _live_engines() - before:
                server.stop()


def _error_document(argv: list[str], err: OpsctlError) -> None:
    """``--json`` promises a document on stdout whatever happened: a command that failed
    before printing its own (unreachable, timeout) prints ``opsctl.error/1``. Bad input
    (exit 2) prints none: nothing was looked at."""
    from opsctl import output

    args = argv[: argv.index("--")] if "--" in argv else argv
    if "--json" not in args or err.exit_code == ExitCode.USAGE:
        return
    words = []
    for arg in args:
        if arg.startswith("-"):
            break
        words.append(arg)
    command = " ".join(
        words[:2] if words[:1] in (["diag"], ["runs"], ["models"], ["engram"]) else words[:1]
    )
    doc = output.error_document(command, int(err.exit_code), err.message, err.hint)
    output.emit(doc, as_json=True, render=lambda _console: None)


def _json_printed() -> int:
    output = sys.modules.get("opsctl.output")
    return output.emitted_json() if output is not None else 0


def _live_engines() -> set:
    server = sys.modules.get("opsctl.engine.server")
    return set(server._LIVE) if server is not None else set()


def _print_version(value: bool) -> None:
    if value:
        from opsctl import __version__

        print(f"opsctl {__version__}")
        raise typer.Exit(0)


def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print opsctl's version and exit (opsctl version: every component)",
    ),
) -> None:
    if ctx.invoked_subcommand is None:  # `opsctl` alone: its help on stdout, exit 0
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def build_app() -> typer.Typer:
    from opsctl.commands import (
        certify,
        console,
        diag,
        engram,
        models,
        patches,
        rules,
        runs,
        serve,
        stacks,
        status,
        version,
    )
    from opsctl.commands.options import EXIT_CODES, epilog

    app = typer.Typer(
        cls=OpsctlGroup,
        name="opsctl",
        help="Operator's command line and dashboard for vLLM.",
        epilog=epilog(
            "opsctl serve",
            "opsctl status 127.0.0.1:8000 --json",
            "opsctl diag invariance --model tiny-llama",
        ).replace(
            EXIT_CODES, "Conventions (flags, durations, URLs, JSON): docs/cli.md\n\n" + EXIT_CODES
        ),
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback(invoke_without_command=True)(_root)
    for module in (
        serve,
        status,
        stacks,
        patches,
        models,
        engram,
        diag,
        runs,
        console,
        certify,
        version,
    ):
        module.register(app)
    rules.register(app)
    return app


app = build_app()


def run(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (usage errors 2, typed errors mapped above)."""
    try:
        code = app(args=argv, prog_name="opsctl", standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
