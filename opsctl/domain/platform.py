"""Which platform a report ran on: the device type vLLM's ``current_platform`` reported
inside the engine (cpu, cuda, rocm, xpu, ...), for every report's ``platform`` field
(vLLM's XPU CI change: checks ask the platform, never assume a device). Pure.

Sources, best first: the engine's patch ledger (each process records
``current_platform``; opsctl's run directory), the server's ``/server_info``
(``vllm_config.device_config``: only with ``VLLM_SERVER_DEV_MODE=1``), else the report
says plainly that it does not know and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

NOT_STARTED = "unknown (not started by opsctl)"
NO_ENGINE = "unknown (no engine involved)"

_DEVICE_TEXT = re.compile(r"device_config=(?:DeviceConfig\()?(?:device=)?'?([A-Za-z0-9_]+)")


def from_server_info(doc: Mapping[str, object] | None) -> str | None:
    """The device type in a ``/server_info`` answer (``config_format`` json or text)."""
    if not isinstance(doc, Mapping):
        return None
    config = doc.get("vllm_config")
    if isinstance(config, Mapping):
        device = config.get("device_config")
        if isinstance(device, Mapping):
            value = device.get("device_type") or device.get("device")
            return str(value) if value and value != "auto" else None
        return None
    if isinstance(config, str):
        m = _DEVICE_TEXT.search(config)
        return m[1] if m and m[1] != "auto" else None
    return None


def label(*sources: str | None, fallback: str = NOT_STARTED) -> str:
    """The first known platform among ``sources`` (ledger first), else ``fallback``."""
    return next((s for s in sources if s), fallback)


def joined(values: Sequence[object]) -> str | None:
    """Distinct known values of several engines (runs, processes), in order, as one
    string; None when none is known."""
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "", "?")))
    return ", ".join(seen) if seen else None
