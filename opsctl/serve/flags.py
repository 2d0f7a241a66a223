"""`opsctl serve [MODEL] [-- extra vLLM args]`: start, supervise and stop a vLLM server.

Typer only: options are checked here (exposure rules in opsctl.domain.exposure), the
work is opsctl.engine.supervise.serve, the dashboard opsctl.serve.view_app."""

from __future__ import annotations

import typer

from opsctl.commands.options import (
    API_KEY_HELP,
    command,
    duration_option,
    rank_option,
    test_knob_option,
    tui_option,
)
from opsctl.domain.weights import LOAD_FORMAT_HELP, check_load_format

EAGER_HELP = (
    "run eagerly (vLLM's --enforce-eager: no torch.compile, no CUDA graphs); starts "
    "faster, serves slower; default: vLLM's default execution mode"
)
SINGLE_HELP = (
    "run the model inside the EngineCore process (one GPU's layout; on CPU it saves "
    "the Worker process's start); default: vLLM's process layout"
)


def _printer(as_json: bool):
    """on_event for supervise.serve: JSON lines (ready, rank_died, stopped) or human lines."""
    import json

    from opsctl import output

    def on_event(name: str, fields: dict) -> None:
        if name == "starting":
            output.info(f"starting vLLM on {fields['model']}; run dir {fields['run_dir']}")
        elif name == "phase":
            output.info(f"  [{fields['elapsed']:5.1f}s] {fields['phase']}")
        elif as_json and name in ("ready", "rank_died", "stopped"):
            doc = output.document("serve/3", event=name, **fields)
            print(json.dumps(doc, default=str), flush=True)
        elif name == "rank_died":
            output.warn(f"a rank died: {fields['summary']}")
        elif name == "ready":
            url, took, run = fields["reachable_url"], fields["healthy_after_s"], fields["run_dir"]
            print(f"ready: {url}  (healthy after {took:.1f} s; run dir {run})", flush=True)
            output.info("Ctrl-C stops the server")
        elif name == "stopped":
            output.info(f"stopped in {fields['duration_s']:.1f} s")
            if fields["leftover_pids"]:
                output.warn(f"processes still alive after stop: {fields['leftover_pids']}")

    return on_event


def _ranked(model, tp, dp, extra: list[str], single_process: bool) -> list[str]:
    """``extra`` with the ranks asked for (``--tp``/``--dp`` or vLLM's own flags) in vLLM's
    spelling; BadInput now for ranks that cannot run (given twice, too many for the CPUs or
    the model's heads, with --single-process)."""
    from opsctl.checks.target import rank_args, refuse_ranks
    from opsctl.domain.rank_flags import argv
    from opsctl.errors import BadInput

    found = rank_args(tp, dp, extra)
    if single_process and (found.tp > 1 or found.dp > 1):
        raise BadInput("--single-process runs one rank; --tp/--dp run one process per rank")
    refuse_ranks(model, found.tp, found.dp, found.rest)
    return [*found.rest, *argv(found.tp, found.dp)]


def register(app: typer.Typer) -> None:
    """Add ``opsctl serve`` to ``app``."""
    command(
        app,
        "serve",
        "Start, supervise and stop a vLLM server.",
        "opsctl serve",
        "opsctl serve tiny-llama --port 8001 --no-tui --json",
        "opsctl serve tiny-llama --eager --single-process",
        "opsctl serve tiny-llama --tp 2",
        "opsctl serve ./my-model --timeout 10m -- --max-model-len 2048",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(serve)


def serve(
    ctx: typer.Context,
    model: str = typer.Argument(
        None,
        metavar="MODEL",
        help="embedded model name or model directory (default tiny-llama)",
    ),
    load_format: str = typer.Option("auto", "--load-format", help=LOAD_FORMAT_HELP),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="bind address; beyond loopback needs --api-key"
    ),
    port: int = typer.Option(8000, "--port", help="port to serve on"),
    timeout: float = duration_option(
        300.0,
        "--timeout",
        help="the longest wait for the engine's /health",
        show_default="5m",
    ),
    tui: bool | None = tui_option(),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="JSON lines on stdout (opsctl.serve/3): ready, rank_died and stopped events",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="VLLM_API_KEY",
        help=API_KEY_HELP + "; serve requires it on /v1 and opsctl uses it too",
    ),
    insecure_bind: bool = typer.Option(
        False, "--insecure-bind", help="allow a non-loopback --host without an API key"
    ),
    eager: bool = typer.Option(False, "--eager", help=EAGER_HELP),
    single_process: bool = typer.Option(False, "--single-process", help=SINGLE_HELP),
    tp: int | None = rank_option("tp"),
    dp: int | None = rank_option("dp"),
    test_knob: list[str] | None = test_knob_option(),
) -> None:
    """Start vLLM's OpenAI server with opsctl's plugin; supervise until Ctrl-C/SIGTERM.

    Extra vLLM server arguments go after `--` (not --host, --port, --api-key: those
    are opsctl's own options).
    """
    from opsctl import output
    from opsctl.commands.options import parse_knobs
    from opsctl.domain.exposure import exposure_note, refuse_owned_args
    from opsctl.engine import supervise
    from opsctl.engine.server import reachable_url

    extra = list(ctx.args)
    if model is not None and model.startswith("-"):
        extra.insert(0, model)
        model = None
    check_load_format(load_format)
    refuse_owned_args(extra)
    extra = _ranked(model, tp, dp, extra, single_process)
    api_key = api_key or None
    note = exposure_note(host, api_key, insecure_bind)
    knobs = parse_knobs(test_knob)
    if note:
        output.warn(f"{note}; reachable as {reachable_url(host, port)}")
    if knobs:
        output.warn(f"TEST KNOBS requested for this engine: {knobs}")
    dashboard = None
    if output.want_tui(tui, as_json):
        from opsctl.serve.view_app import run_dashboard as dashboard
    req = supervise.ServeRequest(
        model, load_format, host, port, timeout, tuple(extra), api_key, knobs,
        eager=eager or "--enforce-eager" in extra, single_process=single_process,
    )  # fmt: skip
    raise typer.Exit(supervise.serve(req, _printer(as_json), dashboard))
