"""opsctl.collectors.gpu against fakes of what it reads (pure logic only: the real NVML
readings are replayed in test_gpu_replay.py, recorded on the H200 by gpu/gpu_hold.py):
a fake pynvml module, a fake sysfs DRM tree and fake /proc fdinfo files. Absent
hardware is "no GPU" with a reason, never an exception and never a zero."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import dataclass

import pytest

from opsctl.collectors import gpu as col
from opsctl.console.judge import (
    READY,
    EndpointView,
    EngineInfo,
    Figures,
    FleetSnapshot,
    LocalState,
    ProcRole,
    Target,
)
from opsctl.console.render_advice import gpu_row_cell as row_cell
from opsctl.console.source import SourceDefaults
from opsctl.domain.gpu import HostGpus, host_from_raw
from tests.waiting import wait_until

GIB = 2**30


class NotSupported(Exception):
    def __str__(self) -> str:
        return "Not Supported"


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None  # NVML's name


def fake_pynvml(init_error: Exception | None = None) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.calls = {"init": 0, "handles": 0}
    nv.NVML_TEMPERATURE_GPU, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 0, 1
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM = 1, 2

    def init():
        nv.calls["init"] += 1
        if init_error is not None:
            raise init_error

    def handle(i):
        nv.calls["handles"] += 1
        return f"h{i}"

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlSystemGetDriverVersion = lambda: b"580.1"
    nv.nvmlDeviceGetName = lambda h: b"Fake H200" if h == "h0" else "Fake L4"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=60 * GIB, total=141 * GIB)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=71, memory=30)
    nv.nvmlDeviceGetTemperature = lambda h, kind: 55
    nv.nvmlDeviceGetTemperatureThreshold = lambda h, kind: 90
    nv.nvmlDeviceGetPowerUsage = lambda h: 350_500
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000

    def fan(h):
        raise NotSupported()

    nv.nvmlDeviceGetFanSpeed = fan
    nv.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind]
    # pid 10 is listed twice (compute and graphics); pid 12 without a figure (MIG)
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: (
        [Proc(10, 5 * GIB), Proc(11, GIB), Proc(12, None)] if h == "h0" else []
    )
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: [Proc(10, 5 * GIB)] if h == "h0" else []
    return nv


@pytest.fixture
def nvml(monkeypatch):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv


def no_drm(tmp_path) -> str:
    (tmp_path / "drm").mkdir()
    return str(tmp_path / "drm")


def test_nvml_reading_maps_every_figure_with_units_and_unknowns(nvml, tmp_path):
    c = col.GpuCollector(drm_root=no_drm(tmp_path))
    raw = c.raw()
    assert raw["source"] == "nvml" and raw["driver_version"] == "580.1"
    assert raw["devices"][0]["errors"] == {"fan": "Not Supported"}
    host = c.collect()
    d0, d1 = host.devices
    assert (d0.name, d1.name, d0.uuid, d0.vendor) == ("Fake H200", "Fake L4", "GPU-h0", "nvidia")
    assert d0.util_pct == 71.0 and d0.mem_used_bytes == 60 * GIB and d0.mem_total_bytes == 141 * GIB
    assert (d0.temp_c, d0.temp_slowdown_c) == (55.0, 90.0)
    assert (d0.power_w, d0.power_limit_w) == (350.5, 700.0)  # NVML's mW -> W
    assert d0.fan_pct is None  # NotSupported is unknown, not 0
    assert (d0.sm_clock_mhz, d0.mem_clock_mhz) == (1980.0, 3201.0)
    assert [(p.pid, p.used_bytes) for p in d0.processes] == [(10, 5 * GIB), (11, GIB), (12, None)]
    assert d1.processes == ()


def test_nvml_is_initialised_once_and_handles_are_cached(nvml, tmp_path):
    c = col.GpuCollector(drm_root=no_drm(tmp_path))
    for _ in range(5):
        c.collect()
    assert nvml.calls == {"init": 1, "handles": 2}


def test_a_failing_nvml_init_is_no_gpu_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(RuntimeError("Driver Not Loaded")))
    host = col.GpuCollector(drm_root=no_drm(tmp_path)).collect()
    assert host.devices == () and host.source is None
    assert host.reason == "no GPU (NVML: Driver Not Loaded)"


def test_without_pynvml_and_without_a_card_it_is_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    host = col.GpuCollector(drm_root=no_drm(tmp_path)).collect()
    assert host.devices == () and host.reason.startswith("no GPU (pynvml not installed")


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_drm(tmp_path):
    """card0 AMD (all files), card1 Intel (name only), card0-DP-1 a connector, card2
    NVIDIA (NVML's): sysfs as amdgpu and i915 lay it out."""
    root = tmp_path / "drm"
    pci = tmp_path / "pci"
    for card, bdf, vendor in (
        ("card0", "0000:03:00.0", "0x1002"),
        ("card1", "0000:00:02.0", "0x8086"),
        ("card2", "0000:04:00.0", "0x10de"),
    ):
        dev = pci / bdf
        write(dev / "vendor", f"{vendor}\n")
        (root / card).mkdir(parents=True)
        (root / card / "device").symlink_to(dev)
    amd = pci / "0000:03:00.0"
    write(amd / "product_name", "AMD Instinct MI300X\n")
    write(amd / "gpu_busy_percent", "42\n")
    write(amd / "mem_info_vram_used", f"{20 * GIB}\n")
    write(amd / "mem_info_vram_total", f"{192 * GIB}\n")
    write(amd / "pp_dpm_sclk", "0: 500Mhz\n1: 2100Mhz *\n")
    write(amd / "pp_dpm_mclk", "0: 900Mhz *\n1: 1300Mhz\n")
    hw = amd / "hwmon" / "hwmon3"
    write(hw / "temp1_input", "61000\n")
    write(hw / "temp1_crit", "100000\n")
    write(hw / "power1_average", "250000000\n")
    write(hw / "power1_cap", "750000000\n")
    (root / "card0-DP-1").mkdir()
    return str(root)


def fake_proc(tmp_path):
    """pid 100: two fds of one DRM client on the AMD card (counted once), one fd that is
    not DRM; pid 101: xe-style drm-total-vram0 on the Intel card; pid 102 unreadable."""
    proc = tmp_path / "proc"
    amd = "drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t7\n"
    write(
        proc / "100" / "fdinfo" / "5",
        amd + "drm-memory-vram:\t4194304 KiB\ndrm-memory-gtt:\t2048 KiB\n",
    )
    write(proc / "100" / "fdinfo" / "6", amd + "drm-memory-vram:\t4194304 KiB\n")
    write(proc / "100" / "fdinfo" / "7", "pos:\t0\nflags:\t02\n")
    write(
        proc / "101" / "fdinfo" / "3",
        "drm-driver:\txe\ndrm-pdev:\t0000:00:02.0\ndrm-client-id:\t9\n"
        "drm-total-vram0:\t1024 MiB\ndrm-resident-vram0:\t1000 MiB\ndrm-total-system:\t10 MiB\n",
    )
    return str(proc)


def test_sysfs_cards_and_fdinfo_memory_per_process(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    c = col.GpuCollector(drm_root=fake_drm(tmp_path), proc=fake_proc(tmp_path))
    host = c.collect(pids=[100, 101, 102])
    assert host.source == "sysfs" and host.reason is None
    amd, intel = host.devices  # the NVIDIA card and the connector are not listed
    assert (amd.vendor, amd.name, amd.index) == ("amd", "AMD Instinct MI300X", 0)
    assert amd.util_pct == 42.0 and amd.mem_used_bytes == 20 * GIB
    assert amd.mem_total_bytes == 192 * GIB
    assert (amd.temp_c, amd.temp_slowdown_c) == (61.0, 100.0)
    assert (amd.power_w, amd.power_limit_w) == (250.0, 750.0)
    assert (amd.sm_clock_mhz, amd.mem_clock_mhz) == (2100.0, 900.0)
    assert amd.fan_pct is None  # no pwm1: unknown
    assert [(p.pid, p.used_bytes) for p in amd.processes] == [(100, 4 * GIB)]
    assert intel.vendor == "intel" and intel.util_pct is None and intel.mem_used_bytes is None
    assert [(p.pid, p.used_bytes) for p in intel.processes] == [(101, GIB)]


def view(url: str, procs: tuple[ProcRole, ...] | None) -> EndpointView:
    local = None if procs is None else LocalState(True, procs=procs)
    return EndpointView(
        Target(url, url, "argument", pid=procs[0].pid if procs else None),
        READY, None, Figures(), EngineInfo(), local, 200, 1.0, 1.0, 2, 0, 0.01,
    )  # fmt: skip


def snapshot(*views: EndpointView) -> FleetSnapshot:
    return FleetSnapshot(1.0, views, 1.0)


def test_with_gpus_attaches_host_and_per_endpoint_gpus_by_role(nvml, tmp_path):
    snap = snapshot(
        view("http://127.0.0.1:8000", (ProcRole(9, "APIServer"), ProcRole(10, "EngineCore"))),
        view("http://127.0.0.1:8001", (ProcRole(20, "APIServer"),)),
        view("http://10.0.0.1:8000", None),
    )
    out = col.with_gpus(snap, col.GpuCollector(drm_root=no_drm(tmp_path)))
    assert len(out.host_gpus.devices) == 2
    on_gpu, off_gpu, remote = out.endpoints
    (d0,) = on_gpu.gpus
    assert [(p.pid, p.role, p.used_bytes) for p in d0.processes] == [(10, "EngineCore", 5 * GIB)]
    assert off_gpu.gpus == () and remote.gpus == ()
    cells = [row_cell(v, out.host_gpus) for v in out.endpoints]
    assert cells == ["GPU0 71% 60/141G", "none", "-"]
    no_gpu = HostGpus(1.0, None, (), "no GPU")
    assert row_cell(off_gpu, no_gpu) == "no GPU" and row_cell(remote, no_gpu) == "-"


def test_gpu_feed_collects_in_its_thread_and_apply_reads_the_latest():
    seen: list[list[int]] = []
    host = host_from_raw({"source": "nvml", "devices": [{"index": 0, "name": "G", "mem_used": 1,
                          "procs": [{"pid": 10, "used": 7}]}]})  # fmt: skip

    def read(pids):
        seen.append(pids)
        return host

    feed = col.GpuFeed(0.2, read=read)
    snap = snapshot(view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),)))
    try:
        first = feed.apply(snap)  # the first look collects now (--once looks once)
        assert seen == [[10]] and first.endpoints[0].gpus[0].processes[0].role == "EngineCore"
        wait_until(lambda: feed.collections >= 3, 10, "the thread's GPU collections")
        out = feed.apply(snap)
    finally:
        feed.close()
    assert seen[1:] and all(p == [10] for p in seen)  # the thread reads the endpoints' pids
    assert out.host_gpus is host and out.endpoints[0].gpus[0].processes[0].role == "EngineCore"


class Fixed(SourceDefaults):
    """A FleetSource of fixed views."""

    live = True

    def __init__(self, *views: EndpointView) -> None:
        self.views = views
        self.closed = False

    def collect(self) -> FleetSnapshot:
        return snapshot(*self.views)

    def close(self) -> None:
        self.closed = True


def hot_host(temp_c: float) -> HostGpus:
    return host_from_raw({"source": "nvml", "devices": [{"index": 0, "name": "G", "temp": temp_c,
                          "procs": [{"pid": 10, "used": GIB}]}]})  # fmt: skip


@pytest.mark.parametrize(("temp_c", "fires"), [(90.0, True), (60.0, False)])
def test_the_advisor_behind_gpu_source_sees_the_gpus(temp_c, fires):
    """The console wraps GpuSource inside the advisor: gpu_thermal reads the GPUs."""
    from opsctl.console import judge_advisor as advisor
    from opsctl.console.gpus import GpuSource, advised

    inner = Fixed(view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),)))
    inner.settings = types.SimpleNamespace(interval_s=0.2)
    src = advised(inner)  # what `opsctl console` does with its live source
    assert isinstance(src.source, GpuSource) and src.source.feed.interval_s == 0.2
    src.source.feed.read = lambda pids: hot_host(temp_c)
    try:
        (v,) = src.collect().endpoints
        assert v.gpus[0].temp_c == temp_c
        codes = {a.code for a in advisor.findings(v)}
        assert ("gpu_thermal" in codes) is fires
        assert src.attaches_gpus  # so the TUI adds no feed of its own
    finally:
        src.close()
    assert inner.closed


def test_importing_the_collector_and_the_console_does_not_load_pynvml():
    code = (
        "import sys, opsctl.collectors.gpu, opsctl.console.view_app, opsctl.console.once; "
        "print('pynvml' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_replay_gets_no_gpu_source():
    from opsctl.console.gpus import advised

    inner = Fixed(view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),)))
    inner.live = False  # a replay's frames carry the GPUs they recorded
    src = advised(inner)
    assert src.source is inner and src.collect().host_gpus is None


def test_a_recorded_frame_keeps_its_gpus_through_the_replay_codec(nvml, tmp_path):
    from opsctl.console.replay import decode, encode

    snap = snapshot(view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),)))
    out = col.with_gpus(snap, col.GpuCollector(drm_root=no_drm(tmp_path)))
    back = decode(json.loads(json.dumps(encode(out))))
    # GpuDevice/GpuProcess/HostGpus come back as themselves
    assert back.host_gpus == out.host_gpus and back.endpoints[0].gpus == out.endpoints[0].gpus
    assert back.endpoints[0].gpus[0].processes[0].role == "EngineCore"


def test_attach_leaves_remote_views_uncopied():
    from opsctl.domain.gpu import attach

    remote = view("http://10.0.0.1:8000", None)
    local = view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),))
    out = attach(snapshot(remote, local), hot_host(50.0))
    assert out.endpoints[0] is remote and out.endpoints[1].gpus
    no_gpu = attach(snapshot(remote), HostGpus(1.0, None, (), "no GPU"))
    assert no_gpu.endpoints[0] is remote and no_gpu.host_gpus.reason == "no GPU"


def test_once_plain_table_has_a_gpu_column_on_a_gpu_host_only(nvml, tmp_path):
    import io

    from rich.console import Console

    from opsctl.console.report import render_plain

    snap = snapshot(view("http://127.0.0.1:8000", (ProcRole(10, "EngineCore"),)))

    def table(s: FleetSnapshot) -> list[str]:
        out = io.StringIO()
        render_plain(Console(file=out, width=300), s)
        return out.getvalue().splitlines()

    on_gpu = table(col.with_gpus(snap, col.GpuCollector(drm_root=no_drm(tmp_path))))
    assert "GPU" in on_gpu[1] and "GPU0 71% 60/141G" in on_gpu[3]
    without = table(col.attach(snap, HostGpus(1.0, None, (), "no GPU")))
    assert "GPU" not in without[1]
