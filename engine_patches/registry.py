"""Patch registry: applies the catalog's patches and writes the per-process ledger.

:func:`apply_all` applies every patch of :mod:`engine_patches.catalog` once per process
(idempotent), never lets one crash the engine, and writes a per-process ledger JSON file
to ``$OPSCTL_RUN_DIR/ledger/<pid>.json``.

Import graph (no cycle): ``registry -> catalog -> patch`` and ``registry -> records``;
the patch types live in :mod:`engine_patches.patch` and the process facts and event
files in :mod:`engine_patches.records`, both leaves. The catalog imports the patch
modules only when asked for the list (:func:`engine_patches.catalog.patches`), so a
patch module may still import the names re-exported here.

Environment:
- ``OPSCTL_RUN_DIR``: run directory (the plugin is inert without it)
- ``OPSCTL_DISABLE_PATCHES``: comma-separated patch names to skip ("all" skips all)

Every ledger record carries ``title``: vLLM's title for the process (``VLLM::EngineCore_DP1``,
``VLLM::Worker_TP1``), rewritten when vLLM sets it after the record was first written, so
opsctl names every rank from the engine's own record. :func:`apply_all` also starts the
exit watcher (:mod:`engine_patches.exits`: ``<run>/exits.jsonl``).

Every ledger record carries ``test_knobs``: the test-only knobs this process honours
(:func:`engine_patches.knobs.active`; ``{}`` on an engine nobody armed), so opsctl shows
a knob-altered engine as such from the engine's own record. ``platform`` is the device
type vLLM reports (cpu, cuda, rocm, xpu, ...) or null; when null, ``platform_note`` says
why (it is null otherwise).

Each patch's record carries ``verified_on`` (the releases it declares), ``verified``
(this vLLM's release is one of them; null when the version is unknown) and ``note``
("unverified on 0.33.0", or null): a patch on an unverified release is still applied or
skipped by its own target check, never silently.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field

from engine_patches import catalog, exits, knobs
from engine_patches.patch import (
    APPLIED,
    FAILED,
    SKIPPED,
    UPSTREAM,
    Outcome,
    Patch,
    missing_symbols,
    verification,
)
from engine_patches.records import (
    on_title_change,
    platform_info,
    platform_name,
    process_role,
    process_title,
    record_event,
    vllm_version,
    write_ledger,
)


@dataclass
class _State:
    results: dict[str, dict] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    pid: int = field(default_factory=os.getpid)  # a forked child starts its own results
    record: dict | None = None  # this process's ledger record as last written
    run_dir: str | None = None


_STATE = _State()


def patches() -> list[Patch]:
    """Every registered patch, in the catalog's order."""
    return catalog.patches()


def _disabled() -> set[str]:
    raw = os.environ.get("OPSCTL_DISABLE_PATCHES", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def apply_patch(patch: Patch, role: str, version: str | None = None) -> dict:
    """Apply one patch in this process; its ledger record.

    ``verified`` says whether ``version`` (this vLLM) is one the patch declares it was
    verified on; when it is not, ``note`` says so ("unverified on 0.33.0") and the patch
    is still applied (its apply function decides from the target itself: applied,
    skipped with the reason, already upstream)."""
    started = time.perf_counter()
    verified, note = verification(patch, version)
    disabled = _disabled()
    if "all" in disabled or patch.name in disabled:
        outcome = Outcome(SKIPPED, "disabled by OPSCTL_DISABLE_PATCHES")
    elif role not in patch.roles:
        outcome = Outcome(SKIPPED, f"not needed in the {role} process")
    else:
        try:
            outcome = patch.apply()
        except Exception as exc:
            outcome = _failed(patch, exc)
    return {
        "name": patch.name,
        "target": patch.target,
        "versions": patch.versions,
        "reason": patch.reason,
        "verified_on": list(patch.verified_on),
        "verified": verified,
        "note": note,
        "status": outcome.status,
        "detail": outcome.detail,
        "seconds": round(time.perf_counter() - started, 6),
    }


def _failed(patch: Patch, exc: Exception) -> Outcome:
    """A patch that raised: skipped with the reason when this vLLM lacks one of its
    declared targets (it cannot apply here), failed with the traceback otherwise."""
    try:
        missing = missing_symbols(patch.symbols)
    except Exception:  # deciding must not fail the engine either
        missing = []
    if missing:
        return Outcome(SKIPPED, f"target not in this vLLM: {', '.join(missing)} ({exc!r})")
    return Outcome(FAILED, f"{exc!r}\n{traceback.format_exc(limit=3)}")


def apply_all(run_dir: str | None = None) -> dict:
    """Apply every patch once in this process and write the ledger. Idempotent."""
    role = process_role()
    platform, platform_note = platform_info()
    version = vllm_version()
    if _STATE.pid != os.getpid():  # forked: this process applies (and records) its own
        _STATE.results, _STATE.lock, _STATE.pid = {}, threading.Lock(), os.getpid()
        _STATE.record = None
    with _STATE.lock:
        for patch in patches():
            if patch.name not in _STATE.results:
                _STATE.results[patch.name] = apply_patch(patch, role, version)
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "role": role,
            # vLLM's title for this process (VLLM::Worker_TP1): opsctl names the rank from
            # it; rewritten when vLLM sets the title after this record (_retitle)
            "title": process_title(),
            "argv": sys.argv[:4],
            "vllm_version": version,
            "platform": platform,
            "platform_note": platform_note,
            "time": time.time(),
            "test_knobs": knobs.active(),
            "patches": list(_STATE.results.values()),
        }
        _STATE.record, _STATE.run_dir = record, run_dir
    write_ledger(record, run_dir)
    on_title_change(_retitle)
    exits.start(run_dir)
    return record


def _retitle(title: str) -> None:
    """vLLM set this process's title after its ledger was written: write it again with
    the title (the rank: ``VLLM::Worker_TP1``)."""
    with _STATE.lock:
        record = _STATE.record
        if record is None or _STATE.pid != os.getpid() or record.get("title") == title:
            return
        record = {**record, "title": title, "titled_at": time.time()}
        _STATE.record = record
    write_ledger(record, _STATE.run_dir)


def reset_for_tests() -> None:
    """Forget which patches this process applied, so a test can apply them again."""
    with _STATE.lock:
        _STATE.results.clear()


__all__ = [
    "APPLIED",
    "FAILED",
    "SKIPPED",
    "UPSTREAM",
    "Outcome",
    "Patch",
    "apply_all",
    "apply_patch",
    "asdict",
    "patches",
    "platform_info",
    "platform_name",
    "process_role",
    "record_event",
    "reset_for_tests",
    "vllm_version",
    "write_ledger",
]
