"""Options and flags shared by commands, and the target a URL or --model names.

``--api-key`` (default VLLM_API_KEY) for every command that talks to a server; the hidden
``--test-knob NAME=VALUE`` for every command that starts an engine (the only way a test
arms an engine_patches knob; knobs in the environment are never passed on)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks.target import parse_knobs

if TYPE_CHECKING:
    from opsctl.checks.target import Target

API_KEY_HELP = "bearer token for a server started with --api-key (default $VLLM_API_KEY)"


def api_key_option():
    """``--api-key`` (default VLLM_API_KEY), the same on every diag that takes a URL."""
    import typer

    return typer.Option(None, "--api-key", envvar="VLLM_API_KEY", help=API_KEY_HELP)


def test_knob_option():
    """``--test-knob NAME=VALUE`` (repeatable, hidden): how a test arms an engine_patches knob."""
    import typer

    return typer.Option(None, "--test-knob", hidden=True)


# --- the one vocabulary (docs/cli.md) ------------------------------------------------------

JSON_HELP = "print the result as one schema-versioned JSON document on stdout"
TUI_HELP = "live dashboard on a terminal (--no-tui: plain progress on stderr)"

EXIT_CODES = (
    "Exit codes: 0 ok, 1 a check failed, 2 bad input or usage, 3 no vLLM server answered, "
    "4 timeout, 130 interrupted."
)


def epilog(*examples: str) -> str:
    """The ``Examples:`` section (kept as written) and the exit codes, for a command's epilog."""
    lines = ["\b", "Examples:", *(f"  {ex}" for ex in examples)]
    return "\n".join(lines) + "\n\n" + EXIT_CODES


def command(app: Any, name: str, summary: str | None, *examples: str, **settings: Any) -> Any:
    """Declare a command the one way: ``app.command`` with its summary and examples epilog."""
    return app.command(name, short_help=summary, epilog=epilog(*examples), **settings)


def json_option():
    """``--json``: the result as one schema-versioned JSON document on stdout."""
    import typer

    return typer.Option(False, "--json", help=JSON_HELP)


def tui_option(default: bool | None = None, help: str = TUI_HELP):
    """``--tui/--no-tui``; None = a dashboard only when stdout and stdin are a terminal."""
    import typer

    return typer.Option(default, "--tui/--no-tui", help=help)


def parse_duration_flag(value, *, allow_zero: bool = False) -> float:
    """Seconds of ``30``, ``30s``, ``5m``, ``2h``, ``1d``; bad, negative or unallowed zero: exit 2."""
    import typer

    from opsctl.domain.runs import parse_duration

    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        try:
            seconds = parse_duration(str(value))
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    if seconds < 0 or (seconds == 0 and not allow_zero):
        floor = "zero or more" if allow_zero else "more than zero"
        raise typer.BadParameter(f"must be {floor}, not {value!r}")
    return seconds


def duration_option(default, *names: str, help: str, allow_zero: bool = False, **kw):
    """A duration flag (30, 30s, 5m, 2h, 1d) that reaches the command as float seconds."""
    import functools

    import typer

    if isinstance(kw.get("show_default"), str):  # Typer would print "[default: (5m)]"
        help, kw["show_default"] = f"{help}  [default: {kw['show_default']}]", False
    parse = functools.partial(parse_duration_flag, allow_zero=allow_zero)
    return typer.Option(default, *names, parser=parse, metavar="DURATION", help=help, **kw)


URL_HELP = "a running vLLM server: http://HOST:PORT, https://HOST:PORT or HOST:PORT"
RUN_HELP = "a run directory, or a run's name (opsctl runs list)"
PROMPT_SETS_HELP = "a sweep on one engine: one seeded prompt set per seed (0-9, 1,3,5)"


def url_argument(help: str = URL_HELP + " (else --model: opsctl starts an engine)"):
    """The optional URL positional of every command that can also start its own engine."""
    import typer

    return typer.Argument(None, metavar="URL", help=help, show_default=False)


def run_path(run: str) -> Path:
    """``--run RUN``: a run directory, or a run's name under $OPSCTL_HOME/runs."""
    from opsctl.paths import runs_dir

    path = Path(run).expanduser()
    if path.is_dir() or "/" in run:
        return path
    return runs_dir() / run


def start_timeout_option(default: str = "10m"):
    """``--timeout DURATION`` of a command that may start its own engine (exit 4 past it).

    With a URL it also caps the first contact (30 s)."""
    return duration_option(
        default, "--timeout", help="the longest wait for a started engine (exit 4 past it)"
    )


RANK_HELP = {
    "tp": "tensor-parallel ranks of the engine opsctl starts (vLLM's --tensor-parallel-size)",
    "dp": "data-parallel engines of the engine opsctl starts (vLLM's --data-parallel-size)",
}


def rank_option(axis: str):
    """``--tp N`` or ``--dp N``: the ranks of an engine opsctl starts (the one grammar)."""
    import typer

    return typer.Option(None, f"--{axis}", metavar="N", help=RANK_HELP[axis], show_default=False)


def seeds_option(help: str = PROMPT_SETS_HELP):
    """``--seeds SEEDS``: a sweep on one engine (``0-9``, ``1,3,5``), read by :func:`seed_list`."""
    import typer

    return typer.Option(None, "--seeds", metavar="SEEDS", help=help)


def url_or_engine(url, model, api_key, timeout, test_knob) -> Target:
    """The server at ``url``, else an engine spec of ``--model`` with the ``--test-knob``s.

    BadInput for both a URL and --model, or for a bad knob."""
    from opsctl.checks.target import EngineSpec, url_or_model, url_target

    base = url_or_model(url, model)
    knobs = tuple(parse_knobs(test_knob, url=base).items())
    return url_target(base, api_key, timeout) if base else EngineSpec(model, knobs=knobs)
