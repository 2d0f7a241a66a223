"""Options shared by commands: ``--api-key`` (default VLLM_API_KEY) for every command
that talks to a server, and the hidden ``--test-knob NAME=VALUE`` for every command
that starts an engine (the only way a test arms an engine_patches knob; knobs in the
environment are never passed on)."""

from __future__ import annotations

from opsctl.errors import BadInput

API_KEY_HELP = "bearer token for a server started with --api-key (default $VLLM_API_KEY)"


def api_key_option():
    """``--api-key`` (default VLLM_API_KEY), the same on every diag that takes a URL."""
    import typer

    return typer.Option(None, "--api-key", envvar="VLLM_API_KEY", help=API_KEY_HELP)


def test_knob_option():
    """``--test-knob NAME=VALUE`` (repeatable), hidden from --help: the only way a test
    arms an engine_patches knob in an engine a diag starts (never the environment)."""
    import typer

    return typer.Option(None, "--test-knob", hidden=True)


def parse_knobs(values: list[str] | None, *, url: str | None = None) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` -> {NAME: VALUE}; unknown names and bad forms are BadInput."""
    from engine_patches import knobs

    out: dict[str, str] = {}
    for raw in values or []:
        name, sep, value = raw.partition("=")
        if not sep or not value:
            raise BadInput(f"--test-knob takes NAME=VALUE, not {raw!r}")
        if name not in knobs.KNOBS:
            raise BadInput(
                f"unknown test knob {name!r}", hint=f"known knobs: {', '.join(knobs.KNOBS)}"
            )
        out[name] = value
    if out and url:
        raise BadInput("--test-knob needs an engine opsctl starts (use --model, not a URL)")
    return out
