"""Replay of the H200 proof of issue 35 item 5 (tests/data/gpu/2026-12-04/hang/,
gpu/hang_gpu.py via `gpu/prove.sh hang`): one tiny-llama engine on CUDA vLLM 0.26.0 in
its default mode (CUDA graphs, async scheduling), a GPU-side hang planted with
OPSCTL_HANG_GPU (the model step spins torch.cuda._sleep kernels and waits on them) and a
host-side one with OPSCTL_HANG_STEP (the EngineCore's step blocks on a lock).

Recorded: `console --once --json` said stalled in both, with the GPU busy (100 %) and
idle (0 %); /health answered 200; the held client request answered 200 once released;
`opsctl stacks` named planted_gpu_hang / planted_hang in the EngineCore, and `--native`
showed the CUDA synchronisation (cuStreamSynchronize in libcuda) under planted_gpu_hang.
The verdicts are recomputed here from the recorded readings and stacks by today's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.domain import gpu as G
from opsctl.stacks import judge as S
from tests.cli.test_json_schemas import validate

RUN = Path(__file__).resolve().parents[1] / "data" / "gpu" / "2026-12-04" / "hang"
DOC = json.loads((RUN / "hang.json").read_text())
EXPECT = {"gpu": ("busy", "planted_gpu_hang"), "host": ("idle", "planted_hang")}


def endpoint(case: str) -> dict:
    (e,) = DOC["cases"][case]["console"]["doc"]["endpoints"]
    return e


def process(d: dict) -> S.ProcessStacks:
    threads = tuple(
        S.Thread(
            t["ident"],
            tuple(S.Frame(f["func"], f["file"], f["line"]) for f in t["frames"]),
            t["current"],
            t.get("name"),
        )
        for t in d["threads"]
    )
    return S.ProcessStacks(d["pid"], d["role"], d["source"], threads, d["state"], d["error"])


def core(case: str, key: str) -> S.ProcessStacks:
    (p,) = [p for p in DOC["cases"][case][key]["doc"]["processes"] if p["role"] == "EngineCore"]
    return process(p)


def test_the_engine_ran_on_cuda_in_the_default_mode_with_both_knobs_armed():
    facts = (RUN / "facts.txt").read_text()
    assert "NVIDIA H200" in facts and "vllm 0.26.0" in facts
    log = (RUN / "hang-run" / "server.log").read_text(errors="replace")
    assert "FULL_AND_PIECEWISE" in log and "Asynchronous scheduling is enabled" in log
    (led,) = [
        json.loads(p.read_text())
        for p in (RUN / "hang-run" / "ledger").glob("*.json")
        if json.loads(p.read_text())["role"] == "engine_core"
    ]
    status = {p["name"]: (p["status"], p["detail"]) for p in led["patches"]}
    assert status["gpu_hang_knob"][0] == "applied" and "spins the GPU" in status["gpu_hang_knob"][1]
    assert status["hang_knob"][0] == "applied"
    base = DOC["baseline"]
    assert base["rc"] == 0 and base["doc"]["endpoints"][0]["state"] == "ready"


@pytest.mark.parametrize("case", list(EXPECT))
def test_each_hang_is_stalled_with_its_gpu_signature(case):
    kind, _ = EXPECT[case]
    c = DOC["cases"][case]
    doc = c["console"]["doc"]
    validate(doc)  # opsctl.console/3, with stall_gpu
    e = endpoint(case)
    assert c["console"]["rc"] == 1 and e["state"] == "stalled" and e["health_status"] == 200
    assert e["stall_gpu"]["signature"] == kind
    # today's rule on the recorded reading gives the same signature
    gpus = tuple(
        G.device_from_nvml({"index": g["index"], "util_gpu": g["util_pct"], "procs": []})
        for g in e["gpus"]
    )
    assert G.stall_gpu("stalled", gpus).kind == kind
    assert e["reason"].endswith(G.stall_gpu("stalled", gpus).detail)
    util = [s["util_gpu"] for sample in c["nvml_while_hung"] for s in sample]
    if kind == "busy":
        assert max(util) >= G.GPU_BUSY_PCT
    else:
        assert max(util) <= G.GPU_IDLE_PCT
    assert c["console_after_hang_s"] < 30  # within the stall window and the canary's 5 s


@pytest.mark.parametrize("case", list(EXPECT))
def test_the_held_request_waited_and_answered_once_released(case):
    c = DOC["cases"][case]
    assert c["health_while_hung"] == 200 and c["answers_while_hung"] == []
    assert c["answers_after_release"] == [200]
    assert c["status_after_release"]["doc"]["state"] == "ready"


@pytest.mark.parametrize("case", list(EXPECT))
def test_stacks_name_the_frame_and_native_stacks_the_cuda_wait(case):
    _, frame = EXPECT[case]
    signal = core(case, "stacks")
    assert signal.source == "signal" and frame in signal.verdict()
    assert signal.verdict() == next(
        p["verdict"]
        for p in DOC["cases"][case]["stacks"]["doc"]["processes"]
        if p["role"] == "EngineCore"
    )
    native = core(case, "stacks_native")
    assert native.source == "py-spy" and f"under {frame} (" in native.verdict()
    if case == "gpu":
        assert "waits in cuStreamSynchronize (libcuda.so" in native.verdict()
