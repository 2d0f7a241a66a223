"""The GPU signature of a stall (issue 35 item 5): a stalled endpoint whose GPUs read busy
is stuck in a kernel or a collective, one whose GPUs read idle waits on the host side.
Pure rule here; the H200 recording of both planted hangs is replayed by
tests/unit/test_gpu_hang_replay.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema

from opsctl.console.judge import STALLED, Target
from opsctl.console.judge_state import EndpointTracker
from opsctl.console.report import endpoint_dict
from opsctl.domain import gpu

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "schemas" / "opsctl.console-4.schema.json"


def dev(index: int, util: float | None) -> gpu.GpuDevice:
    return gpu.device_from_nvml({"index": index, "util_gpu": util, "procs": []})


def test_busy_idle_mixed_and_unknown():
    assert gpu.stall_gpu(STALLED, (dev(0, 100),)).kind == "busy"
    assert gpu.stall_gpu(STALLED, (dev(0, 100), dev(1, 97))).kind == "busy"
    assert gpu.stall_gpu(STALLED, (dev(0, 0),)).kind == "idle"
    assert gpu.stall_gpu(STALLED, (dev(0, 100), dev(1, 0))).kind == "mixed"
    assert gpu.stall_gpu(STALLED, (dev(0, 30),)).kind == "mixed"
    assert gpu.stall_gpu(STALLED, (dev(0, None),)).kind == "unknown"
    assert gpu.stall_gpu("busy", (dev(0, 100),)) is None  # only a stall has a signature
    assert gpu.stall_gpu(STALLED, ()) is None  # remote, or no GPU of its own


def test_the_reason_and_the_document_carry_the_signature():
    v = EndpointTracker(Target("a", "http://127.0.0.1:1", "argument")).view
    stalled = replace(v, state=STALLED, reason="canary: no answer", gpus=(dev(0, 100),))
    assert gpu.shown_reason(stalled) == (
        "canary: no answer; GPU busy (GPU0 100 %): a kernel or collective that does not "
        "finish (the host waits on the device)"
    )
    d = endpoint_dict(stalled, 0.0)
    assert d["stall_gpu"] == {
        "signature": "busy",
        "util_pct": {"GPU0": 100.0},
        "detail": gpu.stall_gpu(STALLED, stalled.gpus).detail,
    }
    assert d["reason"].endswith("(the host waits on the device)")
    idle = endpoint_dict(replace(stalled, gpus=(dev(0, 0),)), 0.0)
    assert idle["stall_gpu"]["signature"] == "idle" and "host side waits" in idle["reason"]
    ready = endpoint_dict(replace(stalled, state="ready", reason=None), 0.0)
    assert ready["stall_gpu"] is None and ready["reason"] is None
    schema = json.loads(SCHEMA.read_text())
    endpoint = {**schema, "$ref": "#/definitions/endpoint"}
    for doc in (d, idle, ready):
        jsonschema.validate(doc, endpoint)
