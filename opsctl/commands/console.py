"""`opsctl console`: one live console over every vLLM server, or over a Prometheus's.

The servers: URL arguments, a targets file, discovered local servers, or the servers a
Prometheus server scrapes (``--prometheus URL [--job NAME]``). Thin: options -> a
FleetSource -> emit."""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import (
    api_key_option,
    duration_option,
    epilog,
    json_option,
)
from opsctl.console import taps as tp
from opsctl.console.judge_state import CANARY_HELP

EPILOG = epilog(
    "opsctl console",
    "opsctl console http://127.0.0.1:8000 http://10.0.0.5:8000 --readonly",
    "opsctl console --once --json --no-discover http://127.0.0.1:8000",
    "opsctl console --prometheus http://127.0.0.1:9090 --job vllm",
    "opsctl console --once --stall-window 30s --interval 2s",
)


_CANARY_TIMEOUT = duration_option("10s", "--canary-timeout", help="--once: " + CANARY_HELP)
_NO_CANARY = typer.Option(False, "--no-canary", help="--once: send no canary request")
_PROMETHEUS_HELP = "read the fleet from this Prometheus server's API"
_PROMETHEUS = typer.Option(None, "--prometheus", metavar="URL", help=_PROMETHEUS_HELP)


def register(app: typer.Typer) -> None:
    """Add ``opsctl console`` to ``app``."""

    @app.command(
        "console",
        short_help="Live console over many vLLM servers; --once is a health gate.",
        epilog=EPILOG,
    )
    def console(
        urls: list[str] = typer.Argument(
            None, metavar="URL", help="base URLs of vLLM servers (http://HOST:PORT or HOST:PORT)"
        ),
        targets_file: Path = typer.Option(
            None, "--targets", metavar="FILE", help="TOML file of [[targets]] (name, url, labels)"
        ),
        no_discover: bool = typer.Option(
            False, "--no-discover", help="do not add local vLLM servers and opsctl runs"
        ),
        prometheus: str = _PROMETHEUS,
        job: str = typer.Option(
            None, "--job", metavar="NAME", help="with --prometheus: the scrape job"
        ),
        interval: float = duration_option("1s", "--interval", help="time between polls"),
        api_key: str = api_key_option(),
        readonly: bool = typer.Option(False, "--readonly", help="no actions on servers"),
        once: bool = typer.Option(
            False,
            "--once",
            help="one look, then exit: one interval, up to --stall-window while an "
            "endpoint with requests running has not been seen generating",
        ),
        as_json: bool = json_option(),
        stall_window: float = duration_option(
            "10s",
            "--stall-window",
            help="requests running with generation, engine steps and KV cache flat this long = stalled",
        ),
        record: Path = typer.Option(
            None, "--record", metavar="FILE", help="write the snapshots (JSONL) to FILE"
        ),
        replay: Path = typer.Option(
            None, "--replay", metavar="FILE", help="show a --record FILE again"
        ),
        tee: str = typer.Option(None, "--tee", metavar="LISTEN=URL", help=tp.TEE_HELP),
        tee_keep_prompts: bool = typer.Option(False, "--tee-keep-prompts", help=tp.KEEP_HELP),
        logs: list[str] = typer.Option(None, "--log", metavar="URL=FILE", help=tp.LOG_HELP),
        canary_timeout: float = _CANARY_TIMEOUT,
        no_canary: bool = _NO_CANARY,
    ) -> None:
        """Live console over many vLLM servers: states (stalled = requests running,
        generation, engine steps and KV cache flat for --stall-window, even with /health
        200), rates, latencies, process roles."""
        from opsctl.console import fleet
        from opsctl.console.judge_state import Settings

        fleet.check_combination(urls or [], targets_file, prometheus, job)
        if not once and not as_json:
            _need_terminal()
        canary = None if no_canary else canary_timeout
        settings = Settings(
            interval_s=interval, stall_window_s=stall_window, canary_timeout_s=canary
        )
        if replay is not None:
            from opsctl.console.replay import open_replay

            others = bool(urls or targets_file or prometheus)
            source = open_replay(replay, others=others, record=record, once=once)
        elif prometheus is not None:
            source = fleet.prometheus_source(prometheus, job, settings, api_key)
        else:
            source = fleet.direct_source(urls or [], targets_file, no_discover, settings, api_key)
        from opsctl.console.gpus import advised  # the advisor, over this host's GPUs

        source = advised(tp.tapped(source, tee, logs, tee_keep_prompts, replay is not None))
        if once or as_json:
            raise typer.Exit(_once(source, settings, as_json, record))
        _live(source, interval, readonly, record, api_key)


def _live(source, interval: float, readonly: bool, record: Path | None, api_key) -> None:
    from opsctl.console.view_app import build_console_app, run_console

    source.start()
    try:
        run_console(
            build_console_app(
                source, interval=interval, readonly=readonly, record=record, api_key=api_key
            )
        )
    finally:
        source.close()


def _need_terminal() -> None:
    import sys

    from opsctl.errors import BadInput

    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise BadInput(
            "the console needs a terminal (stdin and stdout are not TTYs)",
            hint="use --once (plain table) or --once --json for plain output",
        )


def _once(source, settings, as_json: bool, record: Path | None) -> int:
    from opsctl.console.once import report
    from opsctl.errors import BadInput

    if record is not None:
        raise BadInput("--record writes the live console's frames: drop --once/--json")
    return report(source, settings, as_json=as_json)
