"""`opsctl console`: one live console over every vLLM server (URL arguments, a targets
file, discovered local servers), or over the servers a Prometheus server scrapes
(``--prometheus URL [--job NAME]``). Thin: options -> a FleetSource -> emit."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("console")
    def console(
        urls: list[str] = typer.Argument(None, help="base URLs of vLLM servers"),
        targets_file: Path = typer.Option(None, "--targets", help="TOML file of [[targets]]"),
        no_discover: bool = typer.Option(False, "--no-discover", help="no local discovery"),
        prometheus: str = typer.Option(
            None, "--prometheus", help="read the fleet from this Prometheus server's API"
        ),
        job: str = typer.Option(None, "--job", help="with --prometheus: the scrape job"),
        interval: float = typer.Option(1.0, "--interval", help="seconds between polls"),
        api_key: str = typer.Option(
            None, "--api-key", envvar="VLLM_API_KEY", help="Bearer key (default $VLLM_API_KEY)"
        ),
        readonly: bool = typer.Option(False, "--readonly", help="no actions on servers"),
        once: bool = typer.Option(False, "--once", help="one snapshot (over one interval)"),
        as_json: bool = typer.Option(False, "--json", help="JSON (opsctl.console/1)"),
        stall_window: float = typer.Option(10.0, "--stall-window", help="seconds"),
        record: Path = typer.Option(None, "--record", help="write the snapshots (JSONL) to FILE"),
        replay: Path = typer.Option(None, "--replay", help="show a --record FILE again"),
    ) -> None:
        """Live console over many vLLM servers: states /health misses (stalled), rates,
        latency percentiles, process roles (exit 0 all ready, 1 any failing, 3 none
        reachable with --once). With --prometheus, endpoints and figures come from
        Prometheus (its active targets, PromQL), with the same states and JSON."""
        from opsctl.domain.console_state import Settings
        from opsctl.errors import BadInput

        if interval <= 0:
            raise BadInput("--interval must be > 0")
        _check_combination(urls or [], targets_file, prometheus, job)
        if not once and not as_json:
            _need_terminal()
        settings = Settings(interval_s=interval, stall_window_s=stall_window)
        if replay is not None:
            from opsctl.console.replay import open_replay

            others = bool(urls or targets_file or prometheus)
            source = open_replay(replay, others=others, record=record, once=once)
        elif prometheus is not None:
            source = _prometheus_source(prometheus, job, settings)
        else:
            source = _direct_source(urls or [], targets_file, no_discover, settings, api_key)
        if once or as_json:
            if record is not None:
                raise BadInput("--record writes the live console's frames: drop --once/--json")
            raise typer.Exit(_once(source, interval, as_json))
        from opsctl.ui.console_app import build_console_app, run_console

        source.start()
        try:
            run_console(
                build_console_app(
                    source, interval=interval, readonly=readonly, record=record, api_key=api_key
                )
            )
        finally:
            source.close()


def _check_combination(
    urls: list[str], targets_file: Path | None, prometheus: str | None, job: str | None
) -> None:
    from opsctl.errors import BadInput

    if prometheus is not None and (urls or targets_file is not None):
        what = "URL arguments" if urls else "--targets"
        raise BadInput(f"--prometheus reads the fleet from Prometheus: drop {what}")
    if job is not None and prometheus is None:
        raise BadInput("--job selects a Prometheus scrape job: it needs --prometheus URL")


def _direct_source(urls, targets_file, no_discover, settings, api_key):
    from opsctl.console import targets as tg
    from opsctl.console.direct import DirectScrapeSource

    static = tg.from_urls(urls)
    if targets_file is not None:
        static += tg.from_targets_file(targets_file)
    return DirectScrapeSource(static, discover=not no_discover, settings=settings, api_key=api_key)


def _prometheus_source(url, job, settings):
    from opsctl.console.prometheus import PrometheusSource

    source = PrometheusSource(url, job=job, settings=settings)
    source.check()  # exit 3 when nothing answers, 2 when it is not Prometheus
    return source


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
