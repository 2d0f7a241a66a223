"""What an engine opsctl started recorded about itself, read from its run directory.

The engine_info probe (EngineCore config), the batch probe (its init record, one record per
sampling step and one per vision encoder call), the mm_uuid probe (the multimodal items each
request reached the engine core with, when that probe is active), the vLLM version, the
platform and the test knobs in the patch ledger.

Read once into a frozen :class:`EngineRecords`; an engine without a run directory (an
external server) gives the empty value. Used by `diag invariance` to read back the
isolating settings, the batches the engine really formed and the images it got.

:func:`identity` / :func:`identity_at`: the platform vLLM's ``current_platform``
reported in the engine and the vLLM version (every diag report names both): from the
ledger, else (a server opsctl did not start) from the server's ``/server_info`` (only
with ``VLLM_SERVER_DEV_MODE=1``) and ``/version``. The platform is a device name or None
(issue 23's JSON rule: null for unknown, never prose; reports add ``platform_note``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from opsctl import paths
from opsctl.collectors import http, ledger
from opsctl.domain import platform as plat
from opsctl.domain.generation import prompt_index


@dataclass(frozen=True, slots=True)
class EngineRecords:
    """An engine's own records: engine_info, batch and mm_uuid probes, version, knobs."""

    info: Mapping[str, Any] | None = None  # the last engine_info record without an error
    batch: tuple[Mapping[str, Any], ...] = ()  # batch probe records (init, step, nudge)
    probe_init: Mapping[str, Any] | None = None  # the batch probe's init (worker first)
    vllm_version: str | None = None  # from the newest ledger record
    test_knobs: Mapping[str, str] = field(default_factory=dict)
    mm_items: tuple[Mapping[str, Any], ...] | None = None  # mm_uuid records; None: no probe
    platform: str | None = None  # vLLM's current_platform in the engine (ledger)
    gathered: tuple[Mapping[str, Any], ...] = ()  # gate probe: groups released together


def _platform(records: list[dict]) -> str | None:
    """The engine core's platform (else any process's) from ledger records."""
    core = [r for r in records if r.get("role") == "engine_core" and r.get("platform")]
    named = core or [r for r in records if r.get("platform")]
    return str(named[-1]["platform"]) if named else None


def identity(run_dir: Path | None) -> tuple[str | None, str | None]:
    """(platform, vLLM version) the engine of ``run_dir`` recorded in its ledger.

    (None, None) without a run directory or ledger (a server opsctl did not start)."""
    if run_dir is None:
        return None, None
    records = ledger.read_records(run_dir)
    version = next((r["vllm_version"] for r in reversed(records) if r.get("vllm_version")), None)
    return _platform(records), version


def _get_json(url: str, path: str, api_key: str | None, timeout: float) -> dict | None:
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = c.get(f"{url}{path}")
        doc = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def identity_at(
    run_dir: Path | None, url: str | None, api_key: str | None = None, timeout: float = 10.0
) -> tuple[str | None, str | None]:
    """(platform, vLLM version) of the engine behind ``url``; None where nothing names it.

    Its ledger when opsctl started it, else what the server says (/server_info, /version); the
    platform is a device name, never prose."""
    platform, version = identity(run_dir)
    if url and platform is None:
        platform = plat.from_server_info(
            _get_json(url, "/server_info?config_format=json", api_key, timeout)
        )
    if url and version is None:
        found = (_get_json(url, "/version", api_key, timeout) or {}).get("version")
        version = str(found) if found else None
    return plat.first(platform), version


def platform_note(run_dir: Path | None) -> str:
    """Why the platform of the engine of ``run_dir`` is unknown (a report's note).

    The report's ``platform_note``: the engine recorded none, or opsctl did not start it."""
    if run_dir is not None and ledger.read_records(run_dir):
        return plat.NO_RECORD_NOTE
    return plat.NOT_STARTED_NOTE


def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def identity_of_pids(pids: list[int], runs_root: Path | None = None) -> dict[int, tuple]:
    """pid -> (platform, vLLM version) for the live engine processes among ``pids``.

    Only processes an engine opsctl started recorded in a ledger (``<run>/ledger/<pid>.json``,
    written after that process started, so a reused pid is not mistaken for it)."""
    root = paths.runs_dir() if runs_root is None else runs_root
    out: dict[int, tuple] = {}
    for pid in sorted(set(pids)):
        started = _started(pid)
        if started is None:
            continue
        for path in root.glob(f"*/ledger/{pid}.json"):
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(rec, dict) and float(rec.get("time") or 0) >= started - 1.0:
                out[pid] = (rec.get("platform"), rec.get("vllm_version"))
    return out


def _mm_probe_active(records: list[dict]) -> bool:
    return any(e.name == "mm_uuid_probe" and e.status == "applied" for e in ledger.entries(records))


def _last(records: list[dict], **match: Any) -> dict | None:
    for rec in reversed(records):
        if all(rec.get(k) == v for k, v in match.items()):
            return rec
    return None


def _sampler_init(batch: list[dict]) -> dict | None:
    """The batch probe's init record of the process that samples: the one whose pid
    recorded the steps (the Worker in vLLM's multiprocess layout, the EngineCore when
    the model runs inside it); before any step, a Worker's, else the last one."""
    step = _last(batch, event="step")
    if step is not None:
        found = _last(batch, event="init", pid=step.get("pid"))
        if found is not None:
            return found
    return _last(batch, event="init", role="worker") or _last(batch, event="init")


def read(run_dir: Path | None) -> EngineRecords:
    """Everything the engine of ``run_dir`` recorded; the empty value without a run directory."""
    if run_dir is None:
        return EngineRecords()
    infos = [r for r in ledger.read_events(run_dir, "engine_info") if "error" not in r]
    batch = ledger.read_events(run_dir, "batch")
    records = ledger.read_records(run_dir)
    mm = ledger.read_events(run_dir, "mm_uuid") if _mm_probe_active(records) else None
    return EngineRecords(
        infos[-1] if infos else None,
        tuple(batch),
        _sampler_init(batch),
        records[-1].get("vllm_version") if records else None,
        ledger.test_knobs(records),
        tuple(mm) if mm is not None else None,
        _platform(records),
        tuple(r for r in ledger.read_events(run_dir, "gate") if r.get("event") == "released"),
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
    """:func:`read`, once the batch probe recorded every request tagged ``tag`` (or at timeout).

    Every one of ``prompts`` requests must show in the probe's step records (their last lines
    may land just after the responses). No wait when the probe is not active in that engine."""
    deadline = time.monotonic() + timeout
    while True:
        records = read(run_dir)
        if records.probe_init is None or _covers(records.batch, tag, prompts):
            return records
        if time.monotonic() >= deadline:
            return records
        time.sleep(0.05)
