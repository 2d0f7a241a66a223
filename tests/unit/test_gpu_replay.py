"""Replay of the GPU readings recorded on the H200 (tests/data/gpu/console, written by
gpu/gpu_hold.py and gpu/console_gpu.sh; vLLM 0.26.0 CUDA, NVML driver 580.159.04)
through the collector's mapping (opsctl.domain.gpu), checked against what was true
there: the torch holders' amounts, the engine's process roles, nvidia-smi's figures,
and the console documents the bundle's opsctl wrote from the same readings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from opsctl.console.judge import ProcRole
from opsctl.console.render_advice import gpu_detail_lines as detail_lines
from opsctl.console.render_advice import short
from opsctl.domain.gpu import (
    device_dict,
    endpoint_gpu_bytes,
    endpoint_gpus,
    host_from_raw,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu" / "console"
GIB = 2**30


def load(*parts: str) -> dict:
    return json.loads(DATA.joinpath(*parts).read_text())


# ---- (a) torch processes holding 1, 2, 3 GiB ---------------------------------------------


def test_each_holder_is_reported_per_process_with_the_amount_it_holds():
    hold = load("hold", "hold.json")
    host = host_from_raw(load("hold", "raw-held.json"))
    assert host.source == "nvml" and host.devices[0].name == "NVIDIA H200"
    per_pid = {p.pid: p.used_bytes for p in host.devices[0].processes}
    overheads = []
    for h in hold["holders"]:
        got = per_pid[h["pid"]]
        assert got == h["nvml_used_bytes"]  # the recording's verdict was on these figures
        over = got - h["held_bytes"]
        # CUDA context + allocator rounding: the same for every holder, under 1 GiB
        assert 0 <= over <= hold["tolerances"]["overhead_max_bytes"]
        overheads.append(over)
    assert sorted(h["held_bytes"] for h in hold["holders"]) == [GIB, 2 * GIB, 3 * GIB]
    assert max(overheads) - min(overheads) <= hold["tolerances"]["spread_max_bytes"]
    assert hold["verdict"] == "pass" and all(c["ok"] for c in hold["checks"])


def test_the_gpu_used_memory_grows_by_the_holders_and_falls_back():
    before, held, after = (
        host_from_raw(load("hold", f"raw-{n}.json")).devices[0] for n in ("before", "held", "after")
    )
    holders = {h["pid"] for h in load("hold", "hold.json")["holders"]}
    sum_procs = sum(p.used_bytes or 0 for p in held.processes if p.pid in holders)
    assert sum_procs > 6 * GIB
    assert abs((held.mem_used_bytes - before.mem_used_bytes) - sum_procs) <= 256 * 2**20
    assert abs(after.mem_used_bytes - before.mem_used_bytes) <= 256 * 2**20
    assert not {p.pid for p in after.processes} & holders  # they are gone from the list


def test_holders_map_to_roles_and_nothing_else_is_claimed():
    host = host_from_raw(load("hold", "raw-held.json"))
    hold = load("hold", "hold.json")
    roles = [ProcRole(h["pid"], f"holder-{h['held_bytes'] // GIB}GiB") for h in hold["holders"]]
    mine = endpoint_gpus(host, roles[:2])  # an endpoint owning two of the three
    assert [p.role for p in mine[0].processes] == ["holder-1GiB", "holder-2GiB"]
    assert endpoint_gpu_bytes(mine) == sum(h["nvml_used_bytes"] for h in hold["holders"][:2])
    assert endpoint_gpus(host, [ProcRole(1, "APIServer")]) == ()  # not on the GPU


# ---- (b) opsctl serve tiny-llama, console --once --json idle and under load ----------------


# serve: the first recorded run; serve-final: the same with the code as committed (the
# console's GpuSource under the advisor), on another H200 of the pool
RUNS = ("serve", "serve-final")


def _roles(doc: dict) -> list[ProcRole]:
    return [ProcRole(p["pid"], p["role"]) for p in doc["endpoints"][0]["pids"]]


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", ["idle", "load"])
def test_the_engine_core_holds_the_gpu_memory_and_the_document_says_so(run, name):
    doc = load(run, f"console-{name}.json")
    ep = doc["endpoints"][0]
    host = host_from_raw(load(run, f"raw-{name}.json"))
    mine = endpoint_gpus(host, _roles(doc))
    # the replayed reading and the console's own (taken a moment apart) agree on who holds what
    assert [device_dict(d)["processes"] for d in mine] == [g["processes"] for g in ep["gpus"]]
    (gpu,) = ep["gpus"]
    (proc,) = gpu["processes"]
    assert proc["role"] == "EngineCore"  # the API server holds no GPU memory on vLLM 0.26
    assert {p["role"] for p in ep["pids"]} >= {"APIServer", "EngineCore"}
    assert proc["used_bytes"] > 100 * GIB  # --gpu-memory-utilization 0.9 of 141 GB
    assert gpu["mem_used_bytes"] >= proc["used_bytes"]
    assert gpu["mem_total_bytes"] == host.devices[0].mem_total_bytes
    assert gpu["name"] == "NVIDIA H200" and gpu["vendor"] == "nvidia"
    assert gpu["fan_pct"] is None  # passively cooled: NVML says NotSupported, not 0
    assert gpu["power_limit_w"] == 700.0 and 0 < gpu["power_w"] < 700
    assert gpu["temp_c"] > 0 and gpu["temp_slowdown_c"] > gpu["temp_c"]
    assert gpu["sm_clock_mhz"] > 0 and gpu["mem_clock_mhz"] > 0
    # host.gpus lists the same GPU with every process, roles unknown at host level
    assert doc["host"]["gpu_source"] == "nvml" and doc["host"]["gpu_reason"] is None
    assert [p["pid"] for p in doc["host"]["gpus"][0]["processes"]] == [proc["pid"]]
    assert doc["host"]["gpus"][0]["processes"][0]["role"] is None


@pytest.mark.parametrize("run", RUNS)
def test_utilisation_under_load_is_above_idle(run):
    idle, busy = (load(run, f"console-{n}.json")["endpoints"][0] for n in ("idle", "load"))
    assert idle["state"] == "ready" and busy["state"] == "busy"
    assert busy["requests_running"] > 0 and busy["generation_tokens_per_s"] > 0
    assert idle["gpus"][0]["util_pct"] == 0.0
    assert busy["gpus"][0]["util_pct"] > idle["gpus"][0]["util_pct"]
    # every raw reading under the load (1 s apart) saw the GPU busy
    under = [host_from_raw(load(run, f"raw-load-{i}.json")).devices[0] for i in range(1, 6)]
    assert all(d.util_pct and d.util_pct > 0 for d in under)
    assert host_from_raw(load(run, "raw-idle.json")).devices[0].util_pct == 0.0


@pytest.mark.parametrize("run", RUNS)
def test_nvml_figures_match_nvidia_smi(run):
    host = host_from_raw(load(run, "raw-load.json"))
    rows = list(csv.reader(DATA.joinpath(run, "nvidia-smi-load.csv").read_text().splitlines()))
    pid, name, used = (x.strip() for x in rows[1])
    (proc,) = host.devices[0].processes
    assert int(pid) == proc.pid and name == "VLLM::EngineCore"
    assert int(used.split()[0]) == proc.used_bytes // 2**20  # MiB


def test_row_cell_and_drill_in_text_of_the_recorded_engine():
    doc = load("serve", "console-load.json")
    mine = endpoint_gpus(host_from_raw(load("serve", "raw-load.json")), _roles(doc))
    assert short(mine[0]) == "GPU0 7% 130/140G"  # the dump after the console: 7 %
    lines = detail_lines(mine)
    assert lines[0].startswith("GPU0 NVIDIA H200  util 7 %  mem 129.8/140.4 GiB  temp 31 C")
    assert "power 122/700 W" in lines[0] and "fan ?" in lines[0]
    assert "clocks SM 1980 / mem 3201 MHz" in lines[0]
    assert lines[1].strip().startswith("EngineCore pid ") and lines[1].endswith("129.19 GiB")


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", ["idle", "load"])
def test_recorded_documents_validate_against_the_console_schema(run, name):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((DATA.parents[1] / "schemas" / "opsctl.console-3.schema.json").read_text())
    jsonschema.validate(load(run, f"console-{name}.json"), schema)


def test_the_advisor_saw_the_gpu_and_found_nothing_wrong_with_it():
    """serve-final ran the advisor behind GpuSource: with gpu_memory_utilization 0.92 and
    37 C there is no gpu_mem_under or gpu_thermal, while load findings did fire."""
    ep = load("serve-final", "console-load.json")["endpoints"][0]
    codes = {f["code"] for f in ep["findings"]}
    assert ep["gpus"] and "queue_backlog" in codes  # 32 streams on --max-num-seqs 8
    assert not codes & {"gpu_mem_under", "gpu_thermal"}
