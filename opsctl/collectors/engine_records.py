"""What an engine opsctl started recorded about itself, read from its run directory:
the engine_info probe (EngineCore config), the batch probe (its init record, one record
per sampling step and one per vision encoder call), the mm_uuid probe (the multimodal
items each request reached the engine core with, when that probe is active), the vLLM
version, the platform and the test knobs in the patch ledger.

Read once into a frozen :class:`EngineRecords`; an engine without a run directory (an
external server) gives the empty value. Used by `diag invariance` to read back the
isolating settings, the batches the engine really formed and the images it got.

:func:`identity`: the platform vLLM's ``current_platform`` reported in the engine and
the vLLM version, from the ledger (every diag report names both).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.collectors import ledger
from opsctl.domain.invariance_engine import prompt_index


@dataclass(frozen=True, slots=True)
class EngineRecords:
    info: Mapping[str, Any] | None = None  # the last engine_info record without an error
    batch: tuple[Mapping[str, Any], ...] = ()  # batch probe records (init, step, nudge)
    probe_init: Mapping[str, Any] | None = None  # the batch probe's init (worker first)
    vllm_version: str | None = None  # from the newest ledger record
    test_knobs: Mapping[str, str] = field(default_factory=dict)
    mm_items: tuple[Mapping[str, Any], ...] | None = None  # mm_uuid records; None: no probe
    platform: str | None = None  # vLLM's current_platform in the engine (ledger)


NOT_STARTED = "unknown (not started by opsctl)"


def _platform(records: list[dict]) -> str | None:
    """The engine core's platform (else any process's) from ledger records."""
    core = [r for r in records if r.get("role") == "engine_core" and r.get("platform")]
    named = core or [r for r in records if r.get("platform")]
    return str(named[-1]["platform"]) if named else None


def identity(run_dir: Path | None) -> tuple[str | None, str | None]:
    """(platform, vLLM version) the engine of ``run_dir`` recorded in its ledger; (None,
    None) without a run directory or ledger (a server opsctl did not start)."""
    if run_dir is None:
        return None, None
    records = ledger.read_records(run_dir)
    version = next((r["vllm_version"] for r in reversed(records) if r.get("vllm_version")), None)
    return _platform(records), version


def _mm_probe_active(records: list[dict]) -> bool:
    return any(e.name == "mm_uuid_probe" and e.status == "applied" for e in ledger.entries(records))


def _last(records: list[dict], **match: Any) -> dict | None:
    for rec in reversed(records):
        if all(rec.get(k) == v for k, v in match.items()):
            return rec
    return None


def read(run_dir: Path | None) -> EngineRecords:
    if run_dir is None:
        return EngineRecords()
    infos = [r for r in ledger.read_events(run_dir, "engine_info") if "error" not in r]
    batch = ledger.read_events(run_dir, "batch")
    records = ledger.read_records(run_dir)
    mm = ledger.read_events(run_dir, "mm_uuid") if _mm_probe_active(records) else None
    return EngineRecords(
        infos[-1] if infos else None,
        tuple(batch),
        _last(batch, event="init", role="worker") or _last(batch, event="init"),
        records[-1].get("vllm_version") if records else None,
        ledger.test_knobs(records),
        tuple(mm) if mm is not None else None,
        _platform(records),
    )


def _covers(batch: tuple[Mapping[str, Any], ...], tag: str, prompts: int) -> bool:
    seen = {
        i
        for s in batch
        if s.get("event") == "step"
        for i in (prompt_index(str(r), tag) for r in s.get("req_ids") or [])
        if i is not None
    }
    return seen >= set(range(prompts))


def read_after(run_dir: Path | None, tag: str, prompts: int, timeout: float = 2.0) -> EngineRecords:
    """:func:`read`, once the batch probe's step records show every one of ``prompts``
    requests tagged ``tag`` (their last lines may land just after the responses), or
    at ``timeout``. No wait when the probe is not active in that engine."""
    deadline = time.monotonic() + timeout
    while True:
        records = read(run_dir)
        if records.probe_init is None or _covers(records.batch, tag, prompts):
            return records
        if time.monotonic() >= deadline:
            return records
        time.sleep(0.05)
