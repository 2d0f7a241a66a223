"""GPU telemetry, pure: GPU readings as frozen types, mapped onto vLLM's processes.

Raw readings come from NVML or AMD/Intel sysfs and DRM fdinfo; per-process GPU memory
maps onto the roles the console knows (API server, EngineCore, workers per rank).

Unknown is ``None``, never 0: a GPU whose fan NVML cannot read has ``fan_pct=None``;
a host without a GPU (or without a readable driver) has no devices and a ``reason``.
The raw readings are plain dicts (``opsctl.collectors.gpu`` writes them, tests replay
them), so everything here runs without a GPU or a driver.

Raw NVML document (``opsctl.gpu-raw/1``, one per collection)::

    {"schema": "opsctl.gpu-raw/1", "source": "nvml", "taken_at": 1.0, "error": null,
     "driver_version": "...", "devices": [{"index": 0, "name": "...", "uuid": "...",
       "util_gpu": 71, "mem_used": 60e9, "mem_total": 141e9, "temp": 40,
       "temp_slowdown": 90, "power_mw": 120000, "power_limit_mw": 700000,
       "fan": null, "clock_sm": 1980, "clock_mem": 2619,
       "procs": [{"pid": 123, "used": 1e9, "kind": "compute"}]}]}

A reading NVML refused is ``null`` (with ``errors: {field: text}`` beside it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

RAW_SCHEMA = "opsctl.gpu-raw/1"
VENDORS = ("nvidia", "amd", "intel")
PCI_VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
NO_GPU = "no GPU"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process on a GPU: its pid, the memory it holds and its console role."""

    pid: int
    used_bytes: int | None  # None: the driver does not say (e.g. MIG, no permission)
    role: str | None = None  # the console's process role, None: not one of an endpoint's


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU's readings (None where unknown) and the processes on it."""

    index: int
    name: str
    uuid: str | None
    vendor: str  # one of VENDORS
    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: float | None
    temp_slowdown_c: float | None
    power_w: float | None
    power_limit_w: float | None
    fan_pct: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def label(self) -> str:
        """The GPU's short name: ``GPU<index>``."""
        return f"GPU{self.index}"


@dataclass(frozen=True, slots=True)
class HostGpus:
    """One collection of this host's GPUs; no devices with a ``reason``: no GPU.

    The reason also tells a driver that could not be read from no GPU at all."""

    taken_at: float
    source: str | None  # "nvml" | "sysfs" | None (nothing found)
    devices: tuple[GpuDevice, ...] = ()
    reason: str | None = None  # why there are no devices / what could not be read
    driver_version: str | None = None


# ---- raw readings -> types ------------------------------------------------------------------


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _div(v: Any, by: float) -> float | None:
    return None if v is None else float(v) / by


def device_from_nvml(raw: Mapping[str, Any]) -> GpuDevice:
    """One GPU from its raw NVML reading (processes counted once per pid)."""
    procs: dict[int, int | None] = {}
    for p in raw.get("procs") or ():
        pid, used = int(p["pid"]), _int(p.get("used"))
        # a process can be listed as compute and as graphics: count it once
        if pid not in procs or (procs[pid] is None and used is not None):
            procs[pid] = used
    return GpuDevice(
        index=int(raw["index"]),
        name=str(raw.get("name") or f"GPU{raw['index']}"),
        uuid=raw.get("uuid"),
        vendor="nvidia",
        util_pct=_num(raw.get("util_gpu")),
        mem_used_bytes=_int(raw.get("mem_used")),
        mem_total_bytes=_int(raw.get("mem_total")),
        temp_c=_num(raw.get("temp")),
        temp_slowdown_c=_num(raw.get("temp_slowdown")),
        power_w=_div(raw.get("power_mw"), 1000.0),
        power_limit_w=_div(raw.get("power_limit_mw"), 1000.0),
        fan_pct=_num(raw.get("fan")),
        sm_clock_mhz=_num(raw.get("clock_sm")),
        mem_clock_mhz=_num(raw.get("clock_mem")),
        processes=tuple(GpuProcess(pid, used) for pid, used in sorted(procs.items())),
    )


def device_from_sysfs(raw: Mapping[str, Any]) -> GpuDevice:
    """One DRM card (AMD or Intel) from its raw sysfs and fdinfo reading.

    AMD: gpu_busy_percent, mem_info_vram_*, hwmon; Intel: little more than its name;
    ``procs`` from DRM fdinfo (bytes per pid)."""
    procs = raw.get("procs") or {}
    return GpuDevice(
        index=int(raw["index"]),
        name=str(raw.get("name") or raw.get("card") or f"GPU{raw['index']}"),
        uuid=raw.get("uuid"),
        vendor=str(raw.get("vendor") or "amd"),
        util_pct=_num(raw.get("busy_pct")),
        mem_used_bytes=_int(raw.get("vram_used")),
        mem_total_bytes=_int(raw.get("vram_total")),
        temp_c=_div(raw.get("temp_milli_c"), 1000.0),
        temp_slowdown_c=_div(raw.get("temp_crit_milli_c"), 1000.0),
        power_w=_div(raw.get("power_uw"), 1e6),
        power_limit_w=_div(raw.get("power_cap_uw"), 1e6),
        fan_pct=_fan_pct(raw.get("fan_pwm")),
        sm_clock_mhz=_div(raw.get("sclk_hz"), 1e6),
        mem_clock_mhz=_div(raw.get("mclk_hz"), 1e6),
        processes=tuple(
            GpuProcess(int(pid), _int(used)) for pid, used in sorted(procs.items(), key=_pid)
        ),
    )


def _pid(item: tuple[Any, Any]) -> int:
    return int(item[0])


def _fan_pct(pwm: Any) -> float | None:
    return None if pwm is None else round(float(pwm) * 100.0 / 255.0, 1)


def host_from_raw(raw: Mapping[str, Any]) -> HostGpus:
    """A raw collection document (``RAW_SCHEMA``) -> HostGpus."""
    source = raw.get("source")
    make = device_from_nvml if source == "nvml" else device_from_sysfs
    devices = tuple(make(d) for d in raw.get("devices") or ())
    reason = raw.get("error")
    if not devices and not reason:
        reason = NO_GPU
    return HostGpus(
        taken_at=float(raw.get("taken_at") or 0.0),
        source=source if devices else None,
        devices=devices,
        reason=reason,
        driver_version=raw.get("driver_version"),
    )


# ---- per endpoint ---------------------------------------------------------------------------


def endpoint_gpus(host: HostGpus | None, roles: Iterable[Any]) -> tuple[GpuDevice, ...]:
    """The GPUs the endpoint's processes use, each with only those processes.

    ``roles``: objects with ``pid`` and ``role`` (the console's ProcRole: the rank roles
    ``Worker_TP1``, ``EngineCore_DP1``...). Each GPU's processes in rank order. No local
    processes (a remote endpoint) or no GPU: ()."""
    from opsctl.domain.ranks import by_rank

    by_pid = {int(r.pid): r.role for r in roles}
    if host is None or not by_pid:
        return ()
    out = []
    for d in host.devices:
        named = [replace(p, role=by_pid[p.pid]) for p in d.processes if p.pid in by_pid]
        mine = tuple(by_rank(named, lambda p: p.role or ""))
        if mine:
            out.append(replace(d, processes=mine))
    return tuple(out)


def endpoint_gpu_bytes(gpus: Iterable[GpuDevice]) -> int | None:
    """GPU memory the endpoint's processes hold, over its GPUs (None: not known)."""
    total, known = 0, False
    for d in gpus:
        for p in d.processes:
            if p.used_bytes is not None:
                total += p.used_bytes
                known = True
    return total if known else None


# ---- the GPU signature of a stall -----------------------------------------------------------

GPU_BUSY_PCT = 50.0  # a stalled engine's GPU at or above this: busy (a kernel never ends)
GPU_IDLE_PCT = 5.0  # at or below: idle (the host side waits)
STALL_GPU_KINDS = ("busy", "idle", "mixed", "unknown")
STALL_GPU_MEANING = {
    "busy": "a kernel or collective that does not finish (the host waits on the device)",
    "idle": "the host side waits (a lock, I/O, a Python step), nothing runs on the device",
    "mixed": "some GPUs busy, some idle: a collective waiting for a rank that never came",
    "unknown": "the driver did not give the utilisation",
}


@dataclass(frozen=True, slots=True)
class StallGpu:
    """What the GPUs of a stalled endpoint do: busy, idle, mixed or unknown.

    ``kind`` is one of STALL_GPU_KINDS, ``util`` the utilisation per GPU label (None:
    not read)."""

    kind: str
    util: tuple[tuple[str, float | None], ...]

    @property
    def detail(self) -> str:
        """The signature in words: kind, utilisation per GPU and what it means."""
        cells = ", ".join(f"{k} {'?' if u is None else f'{u:.0f} %'}" for k, u in self.util)
        return f"GPU {self.kind} ({cells}): {STALL_GPU_MEANING[self.kind]}"

    def to_dict(self) -> dict[str, Any]:
        """JSON of the signature: kind, utilisation per GPU and detail."""
        return {
            "signature": self.kind,
            "util_pct": {k: u for k, u in self.util},
            "detail": self.detail,
        }


def stall_gpu(state: str, gpus: Iterable[GpuDevice]) -> StallGpu | None:
    """The GPU signature of a stalled endpoint; None in another state or without GPU.

    Busy when every GPU it uses reads at least GPU_BUSY_PCT, idle when every one reads
    at most GPU_IDLE_PCT, mixed otherwise; unknown when none was read."""
    if state != "stalled":
        return None
    util = tuple((d.label, d.util_pct) for d in gpus)
    if not util:
        return None
    known = [u for _, u in util if u is not None]
    if not known:
        kind = "unknown"
    elif min(known) >= GPU_BUSY_PCT:
        kind = "busy"
    elif max(known) <= GPU_IDLE_PCT:
        kind = "idle"
    else:
        kind = "mixed"
    return StallGpu(kind, util)


def shown_reason(view: Any) -> str | None:
    """The endpoint's reason as shown, with a stalled endpoint's GPU signature.

    The row, the drill-in and the JSON show this one; the signature follows the reason."""
    sig = stall_gpu(view.state, getattr(view, "gpus", ()))
    if sig is None:
        return view.reason
    return f"{view.reason}; {sig.detail}" if view.reason else sig.detail


def device_dict(d: GpuDevice) -> dict[str, Any]:
    """JSON of one GPU (units in the names, null for unknown)."""

    def r(v: float | None, nd: int = 1) -> float | None:
        return None if v is None else round(v, nd)

    return {
        "index": d.index,
        "name": d.name,
        "uuid": d.uuid,
        "vendor": d.vendor,
        "util_pct": r(d.util_pct),
        "mem_used_bytes": d.mem_used_bytes,
        "mem_total_bytes": d.mem_total_bytes,
        "temp_c": r(d.temp_c),
        "temp_slowdown_c": r(d.temp_slowdown_c),
        "power_w": r(d.power_w, 2),
        "power_limit_w": r(d.power_limit_w, 2),
        "fan_pct": r(d.fan_pct),
        "sm_clock_mhz": r(d.sm_clock_mhz, 0),
        "mem_clock_mhz": r(d.mem_clock_mhz, 0),
        "processes": [
            {"pid": p.pid, "role": p.role, "used_bytes": p.used_bytes} for p in d.processes
        ],
    }


def host_dict(host: HostGpus | None) -> dict[str, Any]:
    """``host`` of the console document: the host's GPUs, their source and reason.

    ``gpu_reason`` says why there are none ("no GPU", "NVML: ...")."""
    if host is None:
        return {"gpus": [], "gpu_source": None, "gpu_reason": "not collected", "gpu_driver": None}
    return {
        "gpus": [device_dict(d) for d in host.devices],
        "gpu_source": host.source,
        "gpu_reason": host.reason,
        "gpu_driver": host.driver_version,
    }


def local_pids(views: Iterable[Any]) -> list[int]:
    """Every local process of the endpoints (their DRM fdinfo is read on AMD/Intel)."""
    return sorted({p.pid for v in views if v.local is not None for p in v.local.procs})


def attach(snap: Any, host: HostGpus | None) -> Any:
    """The FleetSnapshot with the host's GPUs and each endpoint's own GPUs filled in.

    Both from one host collection, by the endpoints' local process roles."""
    if host is None or not host.devices:  # nothing to attach: the views stay as they are
        views = tuple(v if not v.gpus else replace(v, gpus=()) for v in snap.endpoints)
        return replace(snap, endpoints=views, host_gpus=host)
    out = []
    for v in snap.endpoints:  # a remote endpoint (most of a large fleet) is not copied
        gpus = endpoint_gpus(host, v.local.procs) if v.local is not None else ()
        out.append(v if gpus == v.gpus else replace(v, gpus=gpus))
    return replace(snap, endpoints=tuple(out), host_gpus=host)
