"""Which platform a report ran on: the device type vLLM's ``current_platform`` reported.

The device type is the one reported inside the engine (cpu, cuda, rocm, xpu, ...), for every
report's ``platform`` field (vLLM's XPU CI change: checks ask the platform, never assume a device).
Pure.

Sources, best first: the engine's patch ledger (each process records
``current_platform``; opsctl's run directory), the server's ``/server_info``
(``vllm_config.device_config``: only with ``VLLM_SERVER_DEV_MODE=1``).

JSON rule (docs/cli.md: one name per fact, null for unknown): ``platform`` holds a device
name or null, never prose; when it is null, ``platform_note`` says why (and is null when
the platform is known). :func:`fields` builds the pair; :func:`name` reads a recorded
value (older ledgers wrote "unknown (...)": that reads as None).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# why the platform is unknown (``platform_note``)
NOT_STARTED_NOTE = "not started by opsctl: no patch ledger, and /server_info not exposed"
NO_ENGINE_NOTE = "no engine involved"
NO_RECORD_NOTE = "the engine recorded no platform"

# prose for human lines only (a JSON ``platform`` field is a name or null: use fields())
NOT_STARTED = "unknown (not started by opsctl)"
NO_ENGINE = "unknown (no engine involved)"

_DEVICE_TEXT = re.compile(r"device_config=(?:DeviceConfig\()?(?:device=)?'?([A-Za-z0-9_]+)")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


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


def name(value: object) -> str | None:
    """A recorded platform as a device name (lower case), or None when it names none.

    Device names: cpu, cuda, rocm, xpu, ... Names none: None, "", "?", "auto", or prose such as
    "unknown (...)".
    """
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text in ("", "auto", "unknown", "none", "?") or not _NAME.fullmatch(text):
        return None
    return text


def first(*sources: object) -> str | None:
    """The first source that names a platform (ledger first), else None."""
    return next((n for n in map(name, sources) if n), None)


def fields(*sources: object, note: str = NOT_STARTED_NOTE) -> dict[str, Any]:
    """``{"platform": <name or None>, "platform_note": <why unknown, or None>}``."""
    found = first(*sources)
    return {"platform": found, "platform_note": None if found else note}


def agreed(values: Sequence[object], note: str) -> dict[str, Any]:
    """:func:`fields` for several processes or engines.

    The platform when they name one and the same, else null with ``note`` (none named) or the
    names they disagree on.
    """
    names = list(dict.fromkeys(n for n in map(name, values) if n))
    if len(names) == 1:
        return {"platform": names[0], "platform_note": None}
    why = f"the processes report different platforms: {', '.join(names)}" if names else note
    return {"platform": None, "platform_note": why}


def label(*sources: str | None, fallback: str = NOT_STARTED) -> str:
    """The first known platform among ``sources``, else ``fallback``: prose for a human line.

    Not for a JSON field (a name or null there: :func:`fields`).
    """
    return first(*sources) or fallback


def joined(values: Sequence[object]) -> str | None:
    """Distinct known values of several engines, in order, as one string; None if none known.

    The values of runs or processes alike.
    """
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "", "?")))
    return ", ".join(seen) if seen else None
