"""Replays the issue-34 GPU proof (tests/data/gpu/2026-12-04, `bash gpu/prove.sh recovery |
recovery2 | images` on the H200 with CUDA vLLM 0.26.0): opsctl's patched engine recovers
from KV load failures in vLLM's default mode, vanilla vLLM does not, and the image path
runs. The generic checks of every report (schema, renderers, exit codes, docs/gpu.md's
table) are tests/unit/test_gpu_proof.py's; this module asserts what each run proves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.expect import expected, verdicts

pytestmark = pytest.mark.gpu_recording

DATA = Path(__file__).resolve().parents[2] / "tests/data/gpu/2026-12-04"
RECOVERY = ("kv_hybrid_recompute", "kv_async_inflight", "kv_rewind_v2")


def _doc(name: str) -> dict[str, Any]:
    path = DATA / name
    assert path.is_file(), f"recording missing: {path}"
    return json.loads(path.read_text())


def _run_dir(call: str) -> Path:
    stage, _, name = call.partition("/")
    (run,) = (DATA / stage / "runs" / name).iterdir()
    return run


def _events(call: str, kind: str) -> list[dict]:
    path = _run_dir(call) / "events" / f"{kind}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _engine_facts(stage: str) -> dict[str, str]:
    out = {}
    for line in (DATA / stage / "engine_facts.txt").read_text().splitlines():
        run, _, facts = line.strip().partition(": ")
        out[run] = facts
    return out


def _codes(doc: dict, severity: str = "fail") -> set[str]:
    return {f["code"] for f in doc["findings"] if f["severity"] == severity}


def _patches(doc: dict) -> dict[str, str | None]:
    return {p["name"]: p["status"] for p in doc["recovery_patches"]}


DEFAULT_MODE = (
    "enforce_eager=False compilation=VLLM_COMPILE cudagraph_mode=FULL_AND_PIECEWISE",
    "async_scheduling=enabled v2_model_runner=V2 Model Runner dtype=torch.bfloat16",
)
LOOPED = "20261204-152202-kv-fail-tiny-hybrid-22590"  # before the connector guard
PATCHED = ("recovery/kvfail-llama.json", "recovery2/kvfail-hybrid.json")
UNPATCHED = ("recovery/kvfail-llama-nopatch.json", "recovery2/kvfail-hybrid-nopatch.json")
POLICY_FAIL = ("recovery/kvfail-llama-fail.json", "recovery2/kvfail-hybrid-fail.json")


def test_every_kv_fail_engine_ran_vllm_default_mode_on_cuda():
    seen = 0
    for stage in ("recovery", "recovery2"):
        facts = _engine_facts(stage)
        for run in (DATA / stage / "runs").glob("kvfail-*/*"):  # diag kv-fail --mode default
            if run.name == LOOPED:  # its kept server.log tail has no start-up lines
                continue
            assert all(part in facts[run.name] for part in DEFAULT_MODE), (run, facts[run.name])
            seen += 1
    assert seen == 6  # 3 per model
    for name in (*PATCHED, *UNPATCHED, *POLICY_FAIL):
        doc = _doc(name)
        assert (doc["platform"], doc["vllm_version"]) == ("cuda", "0.26.0"), name


@pytest.mark.parametrize("name", PATCHED)
def test_patched_engine_recovers_bitwise(name):
    doc = _doc(name)
    assert doc["verdict"] == "pass" and doc["engine_alive"] and doc["outputs_identical"]
    assert doc["kv_load_failure_policy"] == "recompute" and doc["tokens_recomputed"] > 0
    assert doc["noise_floor"]["mode"] == "bitwise"
    assert set(_patches(doc).values()) == {"applied"}
    assert "kv_fail.sensitive" in _codes(doc, "ok")  # the comparison would catch a miss
    call = name.replace(".json", "")
    dropped = [e for e in _events(call, "kv_recovery") if e["action"] == "dropped_inflight"]
    assert dropped and all(e["unit"] == "frames" for e in dropped)  # 0.26's discard counter


def test_llama_recovery_rewound_the_v2_runner_to_the_failed_block():
    rewinds = [
        r
        for e in _events("recovery/kvfail-llama", "kv_recovery")
        if e["action"] == "rewound_runner"
        for r in e["requests"]
    ]
    # what docs/gpu.md's trace saw unfixed: the scheduler 64, the runner 123 and 107
    assert sorted((r["device_computed"], r["scheduler_computed"]) for r in rewinds) == [
        (107, 64),
        (123, 64),
    ]
    # the failed step's token and the in-flight step's: both out of the runner's state
    assert {r["dropped_tokens"] for r in rewinds} == {2}
    assert sorted(r["total_len"] for r in rewinds) == [106, 122]


def test_hybrid_recovery_preempts_and_recomputes_once_per_request():
    assert len(_events("recovery2/kvfail-hybrid", "kv_recoveries")) == 2
    assert not [
        e
        for e in _events("recovery2/kvfail-hybrid", "kv_recovery")
        if e["action"] == "rewound_runner"
    ]  # preempted requests come back as new ones: nothing to rewind in the runner


def test_before_the_connector_guard_the_hybrid_recovery_looped():
    """The first run (commit 0cfb427) asked the failing connector again after each
    restart: vLLM 0.26 does not gate the connector on skip_reading_prefix_cache."""
    doc = _doc("recovery/kvfail-hybrid.json")
    assert doc["state"] == "interrupted"
    counts = dict(
        line.split()
        for line in (_run_dir("recovery/kvfail-hybrid") / "events/LINE_COUNTS.txt")
        .read_text()
        .splitlines()
    )
    assert int(counts["kv_recoveries.jsonl"]) > 10_000
    facts = (DATA / "recovery/facts.txt").read_text()
    assert "opsctl commit 0cfb427" in facts
    assert "opsctl commit 5b7f61f" in (DATA / "recovery2/facts.txt").read_text()


def test_vanilla_llama_misses_the_recovery_and_the_report_names_both_defects():
    doc = _doc(UNPATCHED[0])
    assert doc["verdict"] == "fail" and doc["engine_alive"]
    assert {"kv_fail.output_mismatch", "kv_fail.vllm_recovery_bug"} <= _codes(doc)
    assert set(_patches(doc).values()) == {"skipped"}
    (bug,) = [f for f in doc["findings"] if f["code"] == "kv_fail.vllm_recovery_bug"]
    assert "V2 model runner does not apply the scheduler's rewind" in bug["message"]
    assert "kv_rewind_v2 skipped, kv_async_inflight skipped" in bug["message"]
    assert bug["details"]["max_logprob_diff"] > 1.0
    assert not _events("recovery/kvfail-llama-nopatch", "kv_recovery")


def test_vanilla_hybrid_kills_the_engine():
    doc = _doc(UNPATCHED[1])
    assert doc["verdict"] == "fail" and not doc["engine_alive"]
    assert _codes(doc) >= {"kv_fail.engine_died"}
    (died,) = [f for f in doc["findings"] if f["code"] == "kv_fail.engine_died"]
    assert "EngineDeadError" in died["message"] and "kv_hybrid_recompute" in died["message"]


@pytest.mark.parametrize("name", POLICY_FAIL)
def test_policy_fail_fails_the_targeted_requests_and_spares_the_rest(name):
    doc = _doc(name)
    assert doc["verdict"] == "pass" and doc["engine_alive"]
    assert doc["kv_load_failure_policy"] == "fail"
    targeted = doc["injection"]["targets"]
    assert doc["requests_failed"] == len(targeted) == 2
    for row in doc["requests"]:
        if row["index"] in targeted:
            assert row["failed"], row
        else:
            assert not row["failed"] and row["inject"]["identical"], row


def test_float32_recovery_passes_within_the_measured_noise_and_a_miss_fails():
    runs = {r["summary"]["config"]: r["summary"] for r in _doc("recovery2/fp32.json")["results"]}
    ok, miss = runs["v2-eager-fp32"], runs["v2-eager-fp32-nopatch"]
    floor = ok["noise_floor"]
    assert floor["mode"] == "noise_floor" and 0 < floor["max_logprob_diff"] < 1e-4
    assert floor["tolerance"] == 2 * floor["max_logprob_diff"]
    assert ok["verdict"] == "pass" and max(ok["recovered_max_logprob_diff"]) <= floor["tolerance"]
    assert miss["verdict"] == "fail"
    # a missed recovery is four orders of magnitude above the floor
    assert min(miss["recovered_max_logprob_diff"]) > 10_000 * floor["max_logprob_diff"]
    assert {p["status"] for p in ok["recovery_patches"]} == {"applied"}
    assert {p["status"] for p in miss["recovery_patches"]} == {"skipped"}


def test_certify_on_the_gpu_passes_every_applicable_check():
    doc = _doc("recovery2/certify-llama.json")
    assert doc["verdict"] == "pass"
    assert verdicts(doc) == expected(pass_="liveness patches engram invariance kv-fail shutdown")


def test_idefics3_images_run_on_cuda_with_the_patch():
    doc = _doc("images/invariance-vlm.json")
    assert doc["verdict"] == "pass" and doc["platform"] == "cuda"
    ledgers = [
        json.loads(p.read_text())
        for p in (_run_dir("images/invariance-vlm") / "ledger").glob("*.json")
    ]
    status = {
        led["role"]: {p["name"]: p["status"] for p in led["patches"]}["idefics3_unsplit_patches"]
        for led in ledgers
    }
    assert status == {"api_server": "applied", "engine_core": "applied"}
    # mm-uuid's caches-off engine answered every image request (the 12-03 run died on
    # the first); the call ran out of its time while the caches-on engine started
    err = (DATA / "images/mm-uuid-vlm.err").read_text()
    assert err.count("[caches-off]") >= 8 and "reuse #2" in err
    (log,) = (DATA / "images/runs/mm-uuid-vlm").glob("*caches-off*/server.log")
    assert "cannot reshape tensor of 0 elements" not in log.read_text()


@pytest.mark.parametrize("name", ["mm-uuid-vlm", "mm-uuid-blip2"])
def test_explicit_uuids_kept_on_cuda_with_mm_uuid_keep(name):
    """vLLM 0.26 lacks PR 56432: with both caches off it renamed the client's UUIDs
    (images2, before the patch); with mm_uuid_keep applied in the API server both image
    models keep them, caches off and on (uuid stage)."""
    doc = _doc(f"uuid/{name}.json")
    assert doc["verdict"] == "pass" and doc["platform"] == "cuda", doc["findings"]
    runs = sorted((DATA / "uuid/runs" / name).glob("*"))
    assert {r.name.split("-diag-mm-uuid-")[1].split("-tiny")[0] for r in runs} == {
        "caches-off",
        "caches-on",
    }
    for run in runs:
        (api,) = [
            led
            for p in (run / "ledger").glob("*.json")
            if (led := json.loads(p.read_text()))["role"] == "api_server"
        ]
        assert {p["name"]: p["status"] for p in api["patches"]}["mm_uuid_keep"] == "applied"
    before = _doc("images2/mm-uuid-vlm.json")
    assert before["verdict"] == "fail"
    rewritten = [f for f in before["findings"] if "rewritten to 'renderer0-mm-" in str(f)]
    assert len(rewritten) == 4  # opsctl-all-0, opsctl-all-1, opsctl-some-0 and ''
