"""This host's GPUs under the console's advisor (a live source wrapped in GpuSource).

Host and per-endpoint GPUs are attached on every collect (collected once per interval in a
thread: opsctl.collectors.gpu.GpuFeed) before the advisor wraps the source, so that its GPU
findings (gpu_mem_under, gpu_thermal) see the GPUs. A replay keeps what it recorded."""

from __future__ import annotations

from collections.abc import Callable

from opsctl.collectors.gpu import GpuFeed
from opsctl.console.judge import FleetSnapshot
from opsctl.console.source import FleetSource, WrappedSource


class GpuSource(WrappedSource):
    """A FleetSource whose ``collect()`` carries this host's GPUs and each endpoint's.

    Through a :class:`~opsctl.collectors.gpu.GpuFeed`: this host's GPUs as ``host_gpus``,
    each endpoint's as ``gpus``; everything else is the wrapped source's (WrappedSource).
    The console wraps its live source in it first, so that what reads the views after it
    (the advisor's gpu_mem_under and gpu_thermal) sees the GPUs."""

    adds_gpus = True  # the TUI does not add a feed of its own

    def __init__(
        self, source: FleetSource, interval_s: float, read: Callable | None = None
    ) -> None:
        super().__init__(source)
        self.feed = GpuFeed(interval_s, read)

    def collect(self) -> FleetSnapshot:
        """The wrapped source's collection with the GPUs attached."""
        return self.feed.apply(self.source.collect())

    def close(self) -> None:
        """Stop the GPU feed and close the wrapped source."""
        self.feed.close()
        self.source.close()


def advised(source: FleetSource) -> FleetSource:
    """``opsctl.console.advice.advised`` over a GpuSource of ``source`` (live only)."""
    from opsctl.console.advice import advised as with_advice
    from opsctl.console.replay import ReplaySource

    if not isinstance(source, ReplaySource) and source.live:
        settings = source.settings
        source = GpuSource(source, settings.interval_s if settings is not None else 1.0)
    return with_advice(source)
