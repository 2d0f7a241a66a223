"""`opsctl serve [MODEL] [-- extra vLLM args]`: start, supervise and stop a vLLM server.

Exposure policy (checked before anything starts; bad input is exit 2, one line):
- ``--host``, ``--port`` and ``--api-key`` belong to opsctl (it binds, probes and prints
  the URL from them): the same options among the extra vLLM args after ``--`` (also as
  ``--opt=value``, with underscores, or abbreviated as argparse would accept) are refused
  with a hint naming opsctl's flag.
- A host that is not loopback (127.0.0.0/8, ::1, localhost) is refused unless an API key
  is set (``--api-key``, default ``VLLM_API_KEY``) or ``--insecure-bind`` is given. A
  wildcard bind (0.0.0.0, ::) is announced as listening on all interfaces, with a URL
  other machines can use.
"""

from __future__ import annotations

import typer

LOAD_FORMATS = ("auto", "dummy")
# vLLM options opsctl owns -> the opsctl flag that sets them
OWNED_ARGS = {"host": "--host", "port": "--port", "api-key": "--api-key"}
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def owned_extra_arg(extra: list[str]) -> tuple[str, str] | None:
    """The first extra vLLM arg that sets an option opsctl owns: (as given, opsctl flag).

    vLLM's parser turns ``_`` into ``-`` and (argparse) accepts unique prefixes, so
    ``--api_key``, ``--host=0.0.0.0`` and ``--ho`` all count."""
    for arg in extra:
        if arg == "--":
            break
        if not arg.startswith("--") or len(arg) < 4:
            continue
        name = arg[2:].split("=", 1)[0].replace("_", "-").lower()
        for owned, flag in OWNED_ARGS.items():
            if owned.startswith(name):
                return arg, flag
    return None


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be local


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARD_HOSTS


def reachable_url(host: str, port: int) -> str:
    """A URL an operator can use for a server bound to ``host``: for a wildcard bind,
    this machine's name (the bound 0.0.0.0 is no address to connect to from elsewhere)."""
    import socket

    if is_wildcard(host):
        host = socket.getfqdn() or socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def check_exposure(host: str, port: int, api_key: str | None, insecure_bind: bool) -> str | None:
    """Refuse an unauthenticated non-loopback bind (BadInput); return the note to print
    for a bind beyond this machine (None for loopback)."""
    from opsctl.errors import BadInput

    if is_loopback(host):
        return None
    if not api_key and not insecure_bind:
        raise BadInput(
            f"refusing to serve an unauthenticated API on {host!r} (not a loopback address)",
            hint="set --api-key KEY (or VLLM_API_KEY), or pass --insecure-bind if you mean it",
        )
    where = "all interfaces" if is_wildcard(host) else host
    auth = "API key required on /v1" if api_key else "NO authentication (--insecure-bind)"
    return f"listening on {where} ({auth}); reachable as {reachable_url(host, port)}"


def register(app: typer.Typer) -> None:
    @app.command(
        "serve",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def serve(
        ctx: typer.Context,
        model: str = typer.Argument(
            None, help="embedded model name or model directory (default tiny-llama)"
        ),
        load_format: str = typer.Option(
            "auto", "--load-format", help="dummy (random/constant) or auto (real weights)"
        ),
        host: str = typer.Option(
            "127.0.0.1", "--host", help="bind address; beyond loopback needs --api-key"
        ),
        port: int = typer.Option(8000, "--port"),
        timeout: float = typer.Option(300.0, "--timeout", help="seconds to wait for /health"),
        tui: bool = typer.Option(
            None, "--tui/--no-tui", help="live dashboard (default: on a terminal)"
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON lines: ready and stopped events"),
        api_key: str | None = typer.Option(
            None,
            "--api-key",
            envvar="VLLM_API_KEY",
            help="require this bearer token on /v1 (default $VLLM_API_KEY); opsctl uses it too",
        ),
        insecure_bind: bool = typer.Option(
            False, "--insecure-bind", help="allow a non-loopback --host without an API key"
        ),
        test_knob: list[str] | None = typer.Option(None, "--test-knob", hidden=True),
    ) -> None:
        """Start vLLM's OpenAI server with opsctl's plugin; supervise until Ctrl-C/SIGTERM.

        Extra vLLM server arguments go after `--` (not --host, --port, --api-key: those
        are opsctl's own options).
        """
        from opsctl import output
        from opsctl.commands.options import parse_knobs
        from opsctl.commands.serve_run import ServeRequest, run_serve
        from opsctl.errors import BadInput

        extra = list(ctx.args)
        if model is not None and model.startswith("-"):
            extra.insert(0, model)
            model = None
        if load_format not in LOAD_FORMATS:
            raise BadInput(
                f"--load-format must be one of {', '.join(LOAD_FORMATS)}, not {load_format!r}"
            )
        if timeout <= 0:
            raise BadInput("--timeout must be positive")
        owned = owned_extra_arg(extra)
        if owned is not None:
            given, flag = owned
            raise BadInput(
                f"{given!r} after -- sets an option opsctl owns",
                hint=f"use opsctl's own {flag} (before --)",
            )
        api_key = api_key or None
        note = check_exposure(host, port, api_key, insecure_bind)
        knobs = parse_knobs(test_knob)
        if note:
            output.warn(note)
        if knobs:
            output.warn(f"TEST KNOBS requested for this engine: {knobs}")
        req = ServeRequest(
            model, load_format, host, port, timeout, tui, as_json, extra, api_key, knobs
        )
        raise typer.Exit(run_serve(req))
