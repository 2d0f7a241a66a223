"""The fleet source ``opsctl console`` watches, built from its command line.

URL arguments and a targets file (direct scrapes, local servers discovered unless told
not to) or a Prometheus server's targets; the combinations that make no sense are
BadInput."""

from __future__ import annotations

from pathlib import Path


def check_combination(
    urls: list[str], targets_file: Path | None, prometheus: str | None, job: str | None
) -> None:
    """Refuse the fleet options that make no sense together (BadInput)."""
    from opsctl.errors import BadInput

    if prometheus is not None and (urls or targets_file is not None):
        what = "URL arguments" if urls else "--targets"
        raise BadInput(f"--prometheus reads the fleet from Prometheus: drop {what}")
    if job is not None and prometheus is None:
        raise BadInput("--job selects a Prometheus scrape job: it needs --prometheus URL")


def direct_source(urls, targets_file, no_discover, settings, api_key):
    """A direct-scrape fleet source of URL arguments, a targets file and discovery."""
    from opsctl.console import targets as tg
    from opsctl.console.direct import DirectScrapeSource

    static = tg.from_urls(urls)
    if targets_file is not None:
        static += tg.from_targets_file(targets_file)
    return DirectScrapeSource(static, discover=not no_discover, settings=settings, api_key=api_key)


def prometheus_source(url, job, settings, api_key=None):
    """A Prometheus fleet source, checked (exit 3 or 2 when not usable).

    Exit 3 when nothing answers, 2 when what answers is not Prometheus."""
    from opsctl.console.prometheus import PrometheusSource

    source = PrometheusSource(url, job=job, settings=settings, api_key=api_key)
    source.check()
    return source
