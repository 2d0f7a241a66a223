"""Root Typer app: one sub-app per command group.

Importing this module must stay cheap: no torch, no vllm (a test checks sys.modules).
Command modules import heavy dependencies inside their functions.

One place for the CLI contract (docs/cli.md): typed errors become exit codes here, a
usage error is one ``opsctl: error:`` line (plus a ``hint:`` line) with exit 2, ``opsctl``
alone prints its help on stdout (exit 0), and ``--version`` reads the package metadata.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from opsctl.engine.registry import process_engines
from opsctl.errors import OpsctlError
from opsctl.exit_codes import ExitCode


def _usage_error_class() -> type[Exception]:
    """Click's ``UsageError`` as Typer raises it, found through Typer's public
    ``BadParameter`` (Typer >= 0.17 vendors click and exports no other exception)."""
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "UsageError":
            return cls
    return typer.BadParameter  # pragma: no cover - a Typer without the class


UsageError = _usage_error_class()


def _plain_usage_pieces(self: TyperArgument, ctx: Any) -> list[str]:
    """A positional in the usage line as POSIX usage writes it: ``URL`` when required,
    ``[MODEL]`` when optional, ``...`` when repeated (Typer writes ``{URL}``)."""
    raw = self.metavar if self.metavar is not None else (self.name or "")
    name = raw if self.required else f"[{raw}]"
    return [name + ("..." if self.nargs != 1 else "")]


def _option_value_name(self: TyperOption, ctx: Any) -> str | None:
    """An option's value in help by its name (``--port PORT``, ``--api-key API_KEY``),
    or its metavar (``DURATION``), never Typer's Python type (``<int>``, ``<str>``)."""
    if self.metavar is not None:
        return self.metavar
    name = (self.name or "value").upper()
    return name + ("..." if self.nargs != 1 else "")


def _no_argument_type(self: TyperArgument, ctx: Any) -> None:
    """A positional in help is its name alone (``URL``), not ``URL <list[str]>``."""
    return None


# Typer builds its parameters itself (no class to pass), so opsctl's help style replaces
# the public rendering methods of Typer's parameter classes
TyperArgument.get_usage_pieces = _plain_usage_pieces  # type: ignore[method-assign]
TyperOption.display_type_rich = _option_value_name  # type: ignore[method-assign]
TyperArgument.display_type_rich = _no_argument_type  # type: ignore[method-assign]


# --- integers: a plain integer or nothing

PLAIN_INT = r"[+-]?[0-9]+"  # ASCII digits, an optional sign: nothing else is an integer here


def int_annotation(annotation: Any) -> bool:
    """Whether a parameter's annotation takes integers (``int``, ``int | None``, ``list[int]``)."""
    import typing

    if annotation is int:
        return True
    return any(a is int for a in typing.get_args(annotation))


def plain_int(value: Any) -> Any:
    """``value`` unchanged when it is a plain integer's text (or not text); BadParameter else.

    Typer 0.29 converts an ``int`` option with pydantic's lax integer parsing, which reads
    ``0-4`` as -4, ``1_000`` as 1000 and ``1.0`` as 1: ``--seed 0-4`` would run seed -4 without
    a word. Every int option and argument of opsctl passes through this rule first (the CLI
    root installs it below)."""
    import re

    import typer

    texts = value if isinstance(value, list | tuple) else [value]
    for text in texts:
        if isinstance(text, str) and not re.fullmatch(PLAIN_INT, text.strip()):
            raise typer.BadParameter(f"{text!r} is not an integer")
    return value


def _plain_int_values(process_value: Any) -> Any:
    """``process_value`` that first refuses an int parameter's text that is no plain integer
    (opsctl.commands.options.plain_int: Typer would read ``--seed 0-4`` as -4)."""

    def process(self: Any, ctx: Any, value: Any) -> Any:
        desc = getattr(self, "type_descriptor", None)
        if desc is not None and int_annotation(desc.annotation):
            plain_int(value)
        return process_value(self, ctx, value)

    return process


# every int option and argument of every command: one rule, installed once
TyperOption.process_value = _plain_int_values(TyperOption.process_value)  # type: ignore[method-assign]
TyperArgument.process_value = _plain_int_values(TyperArgument.process_value)  # type: ignore[method-assign]


def _name_option_values(command: Any) -> None:
    """Give every option that takes a value its name as metavar (``--port PORT``).

    Typer releases render an option's value in help through different methods (0.29:
    ``display_type_rich``, patched above; 0.27: click's ``make_metavar``, which shows
    ``<str>``); every one of them prints a metavar that is set."""
    for param in getattr(command, "params", ()):
        takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
        if isinstance(param, TyperOption) and param.metavar is None and takes_value:
            param.metavar = _option_value_name(param, None)
    for sub in getattr(command, "commands", {}).values():
        _name_option_values(sub)


ARGV_KEY = "opsctl.argv"  # ctx.meta: the words of the command line, as given


def report_error(err: OpsctlError) -> None:
    """Print a typed error as the one ``opsctl: error:`` line and its ``hint:`` line."""
    print(f"opsctl: error: {err.message}", file=sys.stderr)
    if err.hint:
        print(f"hint: {err.hint}", file=sys.stderr)


def _usage_error(err: Any) -> int:
    """A click usage error as one line plus a hint naming the command's --help."""
    message = " ".join(err.format_message().split())
    param = getattr(err, "param", None)
    if isinstance(err, typer.BadParameter) and param is not None and err.param_hint is None:
        flag = max(param.opts, key=len) if param.opts else (param.human_readable_name or "")
        message = f"{flag}: {' '.join(str(err.message).split())}"  # "--timeout: must be ..."
    print(f"opsctl: error: {message}", file=sys.stderr)
    if err.ctx is not None:
        print(f"hint: see '{err.ctx.command_path} --help'", file=sys.stderr)
    return int(ExitCode.USAGE)


def _framework_error(err: typer.TyperException) -> int:
    """The exit code for an error Typer raised: a group without its command prints its
    help (exit 0), a usage error one line and a hint (2), any other is shown as is."""
    if type(err).__name__ == "NoArgsIsHelpError":
        ctx = getattr(err, "ctx", None)
        typer.echo(ctx.get_help() if ctx else "")
        return 0
    if isinstance(err, UsageError):
        return _usage_error(err)
    show = getattr(err, "show", None)
    if show is not None:
        show()
    else:  # pragma: no cover - every TyperException Typer raises can show itself
        print(f"Error: {err.format_message()}", file=sys.stderr)
    return int(err.exit_code)


class OpsctlGroup(TyperGroup):
    """Maps typed errors to exit codes in one place (also under Typer's CliRunner)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        """Run the command line; return or exit with its exit code, never a traceback."""
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
            code = rv if isinstance(rv, int) else 0
        except typer.TyperException as err:  # click's errors, vendored by Typer
            code = _framework_error(err)
        except typer.Abort:
            print("opsctl: interrupted", file=sys.stderr)
            code = int(ExitCode.INTERRUPTED)
        if not standalone_mode:
            return code
        sys.exit(code)

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[override]
        """Parse the root's arguments, keeping the command line's words.

        They go in ``ctx.meta``: the error document names the command that failed.
        """
        argv = list(args)
        if parent is None:
            _name_option_values(self)
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta[ARGV_KEY] = argv
        return ctx

    def invoke(self, ctx):  # type: ignore[override]
        """Run the command; map its typed errors to exit codes.

        Every engine it started (by any thread) stops when it ends; engines the caller
        had before, e.g. a test's shared engine, are not the command's.
        """
        from opsctl import output

        argv = list(ctx.meta.get(ARGV_KEY, ctx.args))
        with process_engines().scope() as engines, output.recording() as printed:
            try:
                return super().invoke(ctx)
            except OpsctlError as err:
                if not printed.schemas:  # this command printed no document of its own
                    _error_document(argv, err)
                report_error(err)
                raise typer.Exit(int(err.exit_code)) from None
            except KeyboardInterrupt as exc:
                why = f" ({exc.args[0]})" if exc.args else ""
                if not printed.schemas:
                    interrupted = OpsctlError(f"interrupted{why}")
                    interrupted.exit_code = ExitCode.INTERRUPTED
                    _error_document(argv, interrupted)
                print(f"opsctl: interrupted{why}", file=sys.stderr)
                raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
            finally:
                engines.stop_all()


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
    """The opsctl command tree: every command group registered on the root app."""
    from opsctl.commands import (
        certify,
        console,
        diag,
        models,
        patches,
        rules,
        runs,
        status,
        version,
    )
    from opsctl.commands.options import EXIT_CODES, epilog
    from opsctl.serve import flags as serve
    from opsctl.stacks import flags as stacks
    from opsctl.suite.engram import flags_tables as engram

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
