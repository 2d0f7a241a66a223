"""Patch registry: patches are data (name, target, versions, reason, apply function).

:func:`apply_all` applies every registered patch once per process (idempotent),
never lets one crash the engine, and writes a per-process ledger JSON file to
``$OPSCTL_RUN_DIR/ledger/<pid>.json``.

Environment:
- ``OPSCTL_RUN_DIR``: run directory (the plugin is inert without it)
- ``OPSCTL_DISABLE_PATCHES``: comma-separated patch names to skip ("all" skips all)

Every ledger record carries ``test_knobs``: the test-only knobs this process honours
(:func:`engine_patches.knobs.active`; ``{}`` on an engine nobody armed), so opsctl shows
a knob-altered engine as such from the engine's own record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine_patches import knobs

APPLIED = "applied"
UPSTREAM = "already upstream"
SKIPPED = "skipped"
FAILED = "failed"


@dataclass(frozen=True)
class Outcome:
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    versions: str  # human-readable range, checked by the apply function itself
    reason: str  # upstream PR / issue
    apply: Callable[[], Outcome]
    roles: tuple[str, ...] = ("api_server", "engine_core", "worker")


@dataclass
class _State:
    results: dict[str, dict] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()


def patches() -> list[Patch]:
    from engine_patches import catalog

    return list(catalog.PATCHES)


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


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception as exc:  # pragma: no cover - vLLM always importable inside the engine
        return f"unknown ({exc!r})"


def platform_name() -> str:
    """vLLM's current_platform device type (cpu, cuda, rocm, xpu, ...)."""
    try:
        from vllm.platforms import current_platform

        return str(getattr(current_platform, "device_type", None) or current_platform.device_name)
    except Exception as exc:  # pragma: no cover
        return f"unknown ({exc!r})"


def _disabled() -> set[str]:
    raw = os.environ.get("OPSCTL_DISABLE_PATCHES", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def apply_patch(patch: Patch, role: str) -> dict:
    started = time.perf_counter()
    disabled = _disabled()
    if "all" in disabled or patch.name in disabled:
        outcome = Outcome(SKIPPED, "disabled by OPSCTL_DISABLE_PATCHES")
    elif role not in patch.roles:
        outcome = Outcome(SKIPPED, f"not needed in the {role} process")
    else:
        try:
            outcome = patch.apply()
        except Exception as exc:
            outcome = Outcome(FAILED, f"{exc!r}\n{traceback.format_exc(limit=3)}")
    return {
        "name": patch.name,
        "target": patch.target,
        "versions": patch.versions,
        "reason": patch.reason,
        "status": outcome.status,
        "detail": outcome.detail,
        "seconds": round(time.perf_counter() - started, 6),
    }


def apply_all(run_dir: str | None = None) -> dict:
    """Apply every patch once in this process and write the ledger. Idempotent."""
    role = process_role()
    with _STATE.lock:
        for patch in patches():
            if patch.name not in _STATE.results:
                _STATE.results[patch.name] = apply_patch(patch, role)
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "role": role,
            "argv": sys.argv[:4],
            "vllm_version": vllm_version(),
            "platform": platform_name(),
            "time": time.time(),
            "test_knobs": knobs.active(),
            "patches": list(_STATE.results.values()),
        }
    write_ledger(record, run_dir)
    return record


def write_ledger(record: dict, run_dir: str | None = None) -> Path | None:
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


def reset_for_tests() -> None:
    with _STATE.lock:
        _STATE.results.clear()


__all__ = ["APPLIED", "FAILED", "SKIPPED", "UPSTREAM", "Outcome", "Patch", "apply_all", "asdict"]
