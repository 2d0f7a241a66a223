"""GPU telemetry of this host, I/O only: NVML for NVIDIA, sysfs and fdinfo for AMD/Intel.

NVML is ``pynvml`` from the optional ``nvidia-ml-py`` package (the ``gpu`` extra), imported
lazily; sysfs is ``/sys/class/drm/card*/device``, per-process memory DRM fdinfo
(``/proc/PID/fdinfo``, ``drm-memory-*``) where the kernel gives it.

A :class:`GpuCollector` reads once per call and returns the raw document
(``opsctl.domain.gpu.RAW_SCHEMA``: what the driver said, nothing derived) and the
:class:`~opsctl.domain.gpu.HostGpus` made from it; a recorded raw document replays
through the same mapping (``opsctl.domain.gpu.host_from_raw``). It is cheap: NVML is
initialised once and its device handles are cached. Nothing here raises for missing
hardware: no pynvml, a failing ``nvmlInit`` (no driver), no DRM card -> no devices and
a reason ("no GPU", "NVML: ..."); a reading the driver refuses is ``None`` with the
error beside it, never 0.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from opsctl.domain.gpu import (
    NO_GPU,
    PCI_VENDORS,
    RAW_SCHEMA,
    HostGpus,
    attach,
    host_from_raw,
    local_pids,
)

DRM_ROOT = "/sys/class/drm"


# ---- NVIDIA (NVML) --------------------------------------------------------------------------


def _nvml_text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class _Nvml:
    """NVML initialised once, device handles cached. ``error`` set: unusable."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.nv: Any = None
        self.handles: list[Any] = []
        self.driver: str | None = None
        try:
            import pynvml  # nvidia-ml-py: optional (the gpu extra)
        except ImportError:
            self.error = "pynvml not installed (pip install 'opsctl[gpu]')"
            return
        try:
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.error = f"NVML: {_nvml_error(exc)}"
            return
        self.nv = pynvml
        try:
            self.driver = _nvml_text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            self.driver = None

    def read(self) -> list[dict[str, Any]]:
        return [self._device(i, h) for i, h in enumerate(self.handles)]

    def _device(self, index: int, h: Any) -> dict[str, Any]:
        nv = self.nv
        errors: dict[str, str] = {}

        def get(field: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception as exc:  # NotSupported (a fan on a passively cooled GPU), ...
                errors[field] = _nvml_error(exc)
                return None

        mem = get("mem", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        util = get("util_gpu", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        procs: list[dict[str, Any]] = []
        for kind, fn in (
            ("compute", nv.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for p in get(f"procs_{kind}", lambda fn=fn: fn(h)) or ():
                used = getattr(p, "usedGpuMemory", None)
                procs.append(
                    {"pid": int(p.pid), "used": None if used is None else int(used), "kind": kind}
                )
        return {
            "index": index,
            "name": get("name", lambda: _nvml_text(nv.nvmlDeviceGetName(h))),
            "uuid": get("uuid", lambda: _nvml_text(nv.nvmlDeviceGetUUID(h))),
            "util_gpu": None if util is None else util.gpu,
            "util_mem": None if util is None else util.memory,
            "mem_used": None if mem is None else int(mem.used),
            "mem_total": None if mem is None else int(mem.total),
            "temp": get("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "temp_slowdown": get(
                "temp_slowdown",
                lambda: nv.nvmlDeviceGetTemperatureThreshold(
                    h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
                ),
            ),
            "power_mw": get("power_mw", lambda: nv.nvmlDeviceGetPowerUsage(h)),
            "power_limit_mw": get("power_limit_mw", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
            "fan": get("fan", lambda: nv.nvmlDeviceGetFanSpeed(h)),
            "clock_sm": get("clock_sm", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "clock_mem": get("clock_mem", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            "procs": procs,
            "errors": errors,
        }

    def close(self) -> None:
        if self.nv is not None:
            with contextlib.suppress(Exception):
                self.nv.nvmlShutdown()
            self.nv = None


def _nvml_error(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


# ---- AMD / Intel (sysfs + DRM fdinfo) -------------------------------------------------------


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: str | Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _dpm_current_hz(path: str | Path) -> int | None:
    """The active line (``1: 1200Mhz *``) of an AMD pp_dpm_* file, in Hz."""
    text = _read(path)
    for line in (text or "").splitlines():
        if line.rstrip().endswith("*"):
            mhz = line.split(":", 1)[-1].strip().split()[0].lower().removesuffix("mhz")
            try:
                return int(float(mhz) * 1e6)
            except ValueError:
                return None
    return None


def _hwmon(dev: Path) -> dict[str, Any]:
    for hw in sorted(dev.glob("hwmon/hwmon*")):
        return {
            "temp_milli_c": _read_int(hw / "temp1_input"),
            "temp_crit_milli_c": _read_int(hw / "temp1_crit"),
            "power_uw": _read_int(hw / "power1_average") or _read_int(hw / "power1_input"),
            "power_cap_uw": _read_int(hw / "power1_cap"),
            "fan_pwm": _read_int(hw / "pwm1"),
        }
    return {}


def sysfs_cards(root: str = DRM_ROOT) -> list[dict[str, Any]]:
    """AMD and Intel DRM cards (NVIDIA's are read through NVML), in card order."""
    out: list[dict[str, Any]] = []
    for card in sorted(glob.glob(f"{root}/card[0-9]*"), key=_card_no):
        if "-" in os.path.basename(card):  # card0-DP-1: a connector, not a card
            continue
        dev = Path(card) / "device"
        vendor = PCI_VENDORS.get((_read(dev / "vendor") or "").lower())
        if vendor not in ("amd", "intel"):
            continue
        raw: dict[str, Any] = {
            "index": len(out),
            "card": os.path.basename(card),
            "vendor": vendor,
            "name": _read(dev / "product_name") or f"{vendor} {os.path.basename(card)}",
            "uuid": _read(dev / "unique_id"),
            "pci": os.path.basename(os.path.realpath(dev)),
            "busy_pct": _read_int(dev / "gpu_busy_percent"),
            "vram_used": _read_int(dev / "mem_info_vram_used"),
            "vram_total": _read_int(dev / "mem_info_vram_total"),
            "sclk_hz": _dpm_current_hz(dev / "pp_dpm_sclk"),
            "mclk_hz": _dpm_current_hz(dev / "pp_dpm_mclk"),
        }
        raw.update(_hwmon(dev))
        out.append(raw)
    return out


def _card_no(path: str) -> int:
    digits = "".join(c for c in os.path.basename(path).split("-")[0] if c.isdigit())
    return int(digits or 0)


def fdinfo_memory(pids: Iterable[int], proc: str = "/proc") -> dict[str, dict[int, int]]:
    """Per PCI device, GPU memory per pid from DRM fdinfo.

    ``drm-pdev``, ``drm-memory-*`` in KiB, each DRM client counted once (``drm-client-id``).
    Unreadable pids are skipped (another user's process, or gone)."""
    out: dict[str, dict[int, int]] = {}
    for pid in pids:
        seen: set[tuple[str, str]] = set()
        for fd in glob.glob(f"{proc}/{pid}/fdinfo/*"):
            text = _read(fd)
            if not text or "drm-client-id" not in text:
                continue
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            pdev = fields.get("drm-pdev", "").strip()
            client = fields.get("drm-client-id", "").strip()
            if (pdev, client) in seen:
                continue
            seen.add((pdev, client))
            used = _client_bytes(fields)
            out.setdefault(pdev, {})[pid] = out.get(pdev, {}).get(pid, 0) + used
    return out


def _client_bytes(fields: dict[str, str]) -> int:
    """Device memory of one DRM client: ``drm-total-<region>`` of its device-local
    regions (amdgpu ``vram``, xe ``vram0``/i915 ``local0``) where the kernel gives them,
    else the older amdgpu ``drm-memory-vram``."""
    total = [
        v for k, v in fields.items() if k.startswith("drm-total-") and ("vram" in k or "local" in k)
    ]
    if not total:
        total = [v for k, v in fields.items() if k == "drm-memory-vram"]
    return sum(_kib(v) for v in total)


def _kib(v: str) -> int:
    parts = v.split()
    try:
        n = int(parts[0])
    except (ValueError, IndexError):
        return 0
    unit = parts[1].lower() if len(parts) > 1 else ""
    return n * {"kib": 1024, "mib": 2**20, "gib": 2**30}.get(unit, 1)


# ---- the collector --------------------------------------------------------------------------


class GpuCollector:
    """Reads this host's GPUs once per call (NVML or sysfs); one per console.

    NVML handles are cached. The pids given to ``collect`` are the processes whose DRM fdinfo is
    read for AMD/Intel per-process memory (NVML lists its processes itself)."""

    def __init__(self, drm_root: str = DRM_ROOT, proc: str = "/proc") -> None:
        self.drm_root = drm_root
        self.proc = proc
        self._nvml: _Nvml | None = None
        self._lock = threading.Lock()
        self.last_raw: dict[str, Any] | None = None

    def raw(self, pids: Iterable[int] = ()) -> dict[str, Any]:
        """One reading of the GPUs as the raw document (what the driver said, nothing derived)."""
        with self._lock:
            if self._nvml is None:
                self._nvml = _Nvml()
            nvml = self._nvml
            doc: dict[str, Any] = {"schema": RAW_SCHEMA, "taken_at": time.time()}
            if nvml.error is None:
                try:
                    devices = nvml.read()
                except Exception as exc:  # the driver went away under us
                    devices, nvml.error = [], f"NVML: {_nvml_error(exc)}"
                if devices:
                    doc.update(
                        source="nvml", driver_version=nvml.driver, devices=devices, error=None
                    )
                    self.last_raw = doc
                    return doc
            cards = sysfs_cards(self.drm_root)
            if cards:
                per_dev = fdinfo_memory(pids, self.proc)
                for c in cards:
                    c["procs"] = per_dev.get(c.get("pci", ""), {})
                doc.update(source="sysfs", driver_version=None, devices=cards, error=None)
            else:
                # no NVIDIA driver is the usual "no GPU"; the NVML text says which case
                why = NO_GPU if nvml.error is None else f"{NO_GPU} ({nvml.error})"
                doc.update(source=None, driver_version=None, devices=[], error=why)
            self.last_raw = doc
            return doc

    def collect(self, pids: Iterable[int] = ()) -> HostGpus:
        """One reading of the GPUs as :class:`HostGpus` (with per-process memory of ``pids``)."""
        return host_from_raw(self.raw(pids))

    def close(self) -> None:
        """Shut NVML down, if it was started."""
        with self._lock:
            if self._nvml is not None:
                self._nvml.close()
                self._nvml = None


def with_gpus(snap: Any, collector: GpuCollector | None = None) -> Any:
    """``console --once``: one collection now, attached to the snapshot's endpoints."""
    host = (collector or shared()).collect(local_pids(snap.endpoints))
    return attach(snap, host)


class GpuFeed:
    """The TUI's GPU figures, collected once per interval by a daemon thread.

    The UI thread never waits on the driver: ``apply`` attaches the latest collection to a
    snapshot (an in-memory read) and hands the thread the pids to read fdinfo of. ``read``
    replaces the collector (tests feed recorded readings)."""

    def __init__(
        self, interval_s: float, read: Callable[[list[int]], HostGpus] | None = None
    ) -> None:
        self.interval_s = max(0.2, float(interval_s))
        self.read = read or shared().collect
        self.host: HostGpus | None = None
        self.pids: list[int] = []
        self.collections = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self, snap: Any) -> Any:
        """Attach the latest GPU collection to ``snap``; hand the thread its pids.

        The first call collects now (``--once`` looks once; NVML takes well under a
        millisecond), then starts the thread."""
        self.pids = local_pids(snap.endpoints)
        if self._thread is None:
            self._collect()
            self._thread = threading.Thread(target=self._loop, name="console-gpu", daemon=True)
            self._thread.start()
        return attach(snap, self.host) if self.host is not None else snap

    def _collect(self) -> None:
        try:
            self.host = self.read(list(self.pids))
        except Exception as exc:  # a driver error is a reason on screen, never a crash
            self.host = HostGpus(time.time(), None, (), f"GPU collection failed: {exc}")
        self.collections += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._collect()

    def close(self) -> None:
        """Stop the collecting thread."""
        self._stop.set()


@functools.cache
def shared() -> GpuCollector:
    """The process's collector (NVML is initialised once per process)."""
    return GpuCollector()
