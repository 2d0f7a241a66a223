"""What a vLLM process records about itself for opsctl: role, version, ledger, events.

Which process it is (:func:`process_role`; its title as vLLM sets it,
:func:`process_title`, followed by :func:`on_title_change`), the vLLM version and platform it runs,
and the files it writes under ``$OPSCTL_RUN_DIR``: the per-process ledger
(:func:`write_ledger`) and probe events (:func:`record_event`, one JSON line per event).

A leaf module (standard library only, vLLM imported lazily): patch modules, connectors
and :mod:`engine_patches.registry` import it, and it imports none of them.

``platform`` is vLLM's ``current_platform`` device type (cpu, cuda, rocm, xpu, ...) or
None when it cannot be read; the reason then goes to ``platform_note``, never into the
``platform`` field itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path


def process_role() -> str:
    """Which vLLM process this is: api_server, engine_core or worker."""
    import multiprocessing

    name = multiprocessing.current_process().name
    title = ""
    try:
        import setproctitle  # type: ignore[import-not-found]

        title = setproctitle.getproctitle()
    except Exception:
        pass
    text = f"{name} {title}"
    if sys.argv and sys.argv[0].endswith("model_executor/models/registry.py"):
        return "model_inspector"  # vLLM's short-lived architecture-probe subprocess
    if "EngineCore" in text:
        return "engine_core"
    if "Worker" in text or "worker" in text.lower():
        return "worker"
    if name == "MainProcess":
        return "api_server"
    return name


def process_title() -> str:
    """This process's title (vLLM sets ``VLLM::Worker_TP1`` and the like); "" if unknown."""
    try:
        import setproctitle  # type: ignore[import-not-found]

        return str(setproctitle.getproctitle())
    except Exception:
        return ""


_TITLE_HOOK_IN: int | None = None  # pid of the process whose setproctitle is wrapped


def on_title_change(callback) -> bool:
    """Call ``callback(title)`` after every ``setproctitle.setproctitle`` of this process.

    vLLM names a process (``set_process_title``: ``VLLM::Worker_TP1``) after the plugin
    has loaded and the ledger was written; it calls ``setproctitle.setproctitle`` through
    the module, so wrapping the module's function sees every later title. The original
    stays as ``__wrapped__``; a failing callback never reaches vLLM. True when installed."""
    global _TITLE_HOOK_IN
    if os.getpid() == _TITLE_HOOK_IN:
        return True
    try:
        import setproctitle  # type: ignore[import-not-found]
    except Exception:
        return False
    original = getattr(setproctitle.setproctitle, "__wrapped__", setproctitle.setproctitle)

    def setproctitle_and_record(title, *args, **kwargs):
        result = original(title, *args, **kwargs)
        with contextlib.suppress(Exception):
            callback(str(title))
        return result

    setproctitle_and_record.__wrapped__ = original  # type: ignore[attr-defined]
    setproctitle.setproctitle = setproctitle_and_record
    _TITLE_HOOK_IN = os.getpid()
    return True


def vllm_version() -> str | None:
    """vLLM's version; None when it cannot be read."""
    try:
        import vllm

        version = getattr(vllm, "__version__", None)
        return str(version) if version else None
    except Exception:  # pragma: no cover - vLLM always importable inside the engine
        return None


def platform_info() -> tuple[str | None, str | None]:
    """vLLM's platform device type, or None and why it is unknown.

    As (platform, note): current_platform's device type (cpu, cuda, rocm, xpu, ...)
    and None, or None and the reason."""
    try:
        from vllm.platforms import current_platform

        name = getattr(current_platform, "device_type", None) or current_platform.device_name
    except Exception as exc:  # pragma: no cover - vLLM always importable inside the engine
        return None, f"vllm.platforms.current_platform failed: {exc!r}"
    if not name:
        return None, "vLLM's current_platform names no device type"
    return str(name), None


def platform_name() -> str | None:
    """vLLM's current_platform device type (cpu, cuda, rocm, xpu, ...); None if unknown."""
    return platform_info()[0]


def write_ledger(record: dict, run_dir: str | None = None) -> Path | None:
    """Write ``<run>/ledger/<pid>.json`` atomically; None without a run directory."""
    base = run_dir or os.environ.get("OPSCTL_RUN_DIR")
    if not base:
        return None
    ledger = Path(base) / "ledger"
    ledger.mkdir(parents=True, exist_ok=True)
    path = ledger / f"{record['pid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def record_event(kind: str, payload: dict, run_dir: str | None = None) -> None:
    """Append one JSON line to ``<run>/events/<kind>.jsonl`` (probes and connectors)."""
    base = run_dir or os.environ.get("OPSCTL_RUN_DIR")
    if not base:
        return
    events = Path(base) / "events"
    events.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"pid": os.getpid(), "time": time.time(), **payload}, default=str)
    with open(events / f"{kind}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def record_quietly(kind: str, payload: dict) -> None:
    """Append an event, never raising (the ledger is best effort).

    :func:`record_event` that never raises, for code on the engine's own path (a
    recovery must not depend on the ledger: it is best effort)."""
    with contextlib.suppress(Exception):
        record_event(kind, payload)
