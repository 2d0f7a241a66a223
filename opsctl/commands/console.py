"""`opsctl console`: one live console over every vLLM server (URL arguments, a targets
file, discovered local servers). Thin: options -> opsctl.console -> emit."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("console")
    def console(
        urls: list[str] = typer.Argument(None, help="base URLs of vLLM servers"),
        targets_file: Path = typer.Option(None, "--targets", help="TOML file of [[targets]]"),
        no_discover: bool = typer.Option(False, "--no-discover", help="no local discovery"),
        interval: float = typer.Option(1.0, "--interval", help="seconds between polls"),
        api_key: str = typer.Option(
            None, "--api-key", envvar="VLLM_API_KEY", help="Bearer key (default $VLLM_API_KEY)"
        ),
        readonly: bool = typer.Option(False, "--readonly", help="no actions on servers"),
        once: bool = typer.Option(False, "--once", help="one snapshot (over one interval)"),
        as_json: bool = typer.Option(False, "--json", help="JSON (opsctl.console/1)"),
        stall_window: float = typer.Option(10.0, "--stall-window", help="seconds"),
    ) -> None:
        """Live console over many vLLM servers: states /health misses (stalled), rates,
        latency percentiles, process roles (exit 0 all ready, 1 any failing, 3 none
        reachable with --once)."""
        from opsctl.console import targets as tg
        from opsctl.console.direct import DirectScrapeSource
        from opsctl.domain.console_state import Settings
        from opsctl.errors import BadInput

        if interval <= 0:
            raise BadInput("--interval must be > 0")
        if not once and not as_json:
            _need_terminal()
        static = tg.from_urls(urls or [])
        if targets_file is not None:
            static += tg.from_targets_file(targets_file)
        settings = Settings(interval_s=interval, stall_window_s=stall_window)
        source = DirectScrapeSource(
            static, discover=not no_discover, settings=settings, api_key=api_key
        )
        if once or as_json:
            raise typer.Exit(_once(source, interval, as_json))
        from opsctl.ui.console_app import build_console_app

        source.start()
        try:
            build_console_app(source, interval=interval, readonly=readonly).run()
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


def _once(source, interval: float, as_json: bool) -> int:
    from opsctl.console.report import document, render_plain
    from opsctl.output import emit, info

    source.start()
    try:
        source.wait_settled(timeout=2 * interval + source.timeout + 5.0)
        snap = source.collect()
    finally:
        source.close()
    doc = document(snap)
    emit(doc, as_json=as_json, render=lambda c: render_plain(c, snap))
    if snap.hint and as_json:
        info(f"hint: {snap.hint}")
    return int(doc["exit_code"])
