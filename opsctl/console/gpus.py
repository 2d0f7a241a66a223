"""This host's GPUs under the console's advisor (a live source wrapped in GpuSource).

The live source is wrapped in :class:`opsctl.collectors.gpu.GpuSource` (host and
per-endpoint GPUs attached on every collect, collected once per interval in a thread)
before the advisor wraps it, so that its GPU findings (gpu_mem_under, gpu_thermal) see
the GPUs. A replay keeps what it recorded."""

from __future__ import annotations

from typing import Any


def advised(source: Any) -> Any:
    """``opsctl.console.advice.advised`` over a GpuSource of ``source`` (live only)."""
    from opsctl.collectors.gpu import GpuSource
    from opsctl.console.advice import advised as with_advice
    from opsctl.console.replay import ReplaySource

    if not isinstance(source, ReplaySource) and getattr(source, "live", True):
        settings = getattr(source, "settings", None)
        source = GpuSource(source, settings.interval_s if settings is not None else 1.0)
    return with_advice(source)
