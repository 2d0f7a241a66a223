"""The console's taps on servers it does not run: ``--tee`` and ``--log``.

``--tee LISTEN=URL`` is a recording proxy (opsctl.console.tee), ``--log URL=FILE`` a
tailed log (opsctl.console.logsource).
:func:`parse` checks the options and binds the tee's port before anything starts (bad
input, a port in use: BadInput, exit 2); :func:`wrap` puts them around a FleetSource."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opsctl.errors import BadInput

if TYPE_CHECKING:  # `opsctl --help` imports this module for the help texts: keep it light
    from opsctl.console.source import FleetSource

TEE_HELP = (
    "a proxy on LISTEN (HOST:PORT or PORT, 127.0.0.1) in front of the server at URL: the "
    "console shows its live requests (tokens, TTFT, duration, status); no prompt text kept"
)
KEEP_HELP = "with --tee: keep and show the prompt texts"
LOG_HELP = "tail FILE as the log of the server at URL (phase, decisive lines); repeatable"


@dataclass
class Taps:
    """The checked taps: a bound tee proxy, the logs by URL, and whether it replays."""

    tee: Any = None  # a bound opsctl.console.tee.TeeProxy
    logs: dict[str, str] = field(default_factory=dict)  # URL -> file
    replay: bool = False  # a replay shows what was recorded: nothing to add

    def wrap(self, source: FleetSource) -> FleetSource:
        """``source`` with the taps around it (a replay unwrapped)."""
        return source if self.replay else wrap(source, self)

    def urls(self) -> list[str]:
        """The servers the taps are on (the console watches them)."""
        out = list(self.logs)
        if self.tee is not None:
            out.insert(0, self.tee.spec.upstream)
        return out


def parse(
    tee: str | None,
    logs: list[str] | None,
    *,
    keep_prompts: bool = False,
    any_address: bool = False,
    replay: bool = False,
) -> Taps:
    """The taps of ``--tee`` and ``--log``, checked and with the tee's port bound."""
    if replay and (tee or logs):
        raise BadInput("--tee and --log watch live servers: drop --replay")
    if keep_prompts and not tee:
        raise BadInput("--tee-keep-prompts keeps the prompts of --tee: it needs --tee")
    if any_address and not tee:
        raise BadInput("--tee-any-address is about --tee's LISTEN: it needs --tee")
    from opsctl.console.logsource import parse_log_option

    taps = Taps(replay=replay)
    for spec in logs or ():
        url, path = parse_log_option(spec)
        taps.logs[url] = path
    if tee:
        from opsctl.console.tee import TeeProxy, parse_tee

        proxy = TeeProxy(parse_tee(tee, any_address), keep_prompts=keep_prompts)
        proxy.bind()  # a port in use is exit 2 now, not a dead proxy later
        taps.tee = proxy
    return taps


def tapped(
    source: FleetSource, tee: str | None, logs: list[str] | None, keep_prompts: bool, replay: bool
) -> FleetSource:
    """``source`` with ``--tee``/``--log`` applied: options checked, targets added, wrapped.

    Bad options or a tee port that cannot be bound: BadInput (exit 2). The tapped
    servers join a direct source's targets; a targets file's ``log`` keys are tailed too."""
    taps = parse(tee, logs, keep_prompts=keep_prompts, replay=replay)
    static = source.static
    if static is not None and taps.urls():
        from opsctl.console import targets as tg

        have = {tg.endpoint_key(t.url) for t in static}
        static += [t for t in tg.from_urls(taps.urls()) if tg.endpoint_key(t.url) not in have]
    return taps.wrap(source)


def with_urls(urls: list[str], taps: Taps) -> list[str]:
    """``urls`` plus the taps' servers that are not among them."""
    from opsctl.console.targets import endpoint_key, normalise_url

    have = {endpoint_key(normalise_url(u)) for u in urls}
    return [*urls, *(u for u in taps.urls() if endpoint_key(u) not in have)]


def wrap(source: FleetSource, taps: Taps) -> FleetSource:
    """``source`` wrapped by the tee (if any) and the log tails."""
    from opsctl.console.logsource import LoggedSource

    if taps.tee is not None:
        from opsctl.console.tee import TeedSource

        source = TeedSource(source, taps.tee)
    return LoggedSource(source, taps.logs)  # also a targets file's 'log' keys
