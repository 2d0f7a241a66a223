"""opsctl.domain.probe_evidence: what a check says when the engine's ledger shows a
probe it relies on could not hook (fail-closed) or is unverified on this vLLM
(warning); and the checks that use it (invariance, lora, mm-uuid) carry those findings.
Ledger records come from the registry's real apply_patch where the probe can run here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_patches.patches import batch_probe
from engine_patches.registry import apply_patch
from opsctl.domain import probe_evidence as pe
from opsctl.domain.findings import FAIL, WARNING
from opsctl.suite.invariance import run as invariance
from opsctl.suite.lora import judge as DL
from opsctl.suite.lora import run as lora
from opsctl.suite.mm_uuid import run as mm_uuid


def record(role: str, version: str, *patches: dict) -> dict:
    return {"pid": 1, "role": role, "vllm_version": version, "patches": list(patches)}


def entry(name: str, status: str, detail: str = "", verified=True, note=None) -> dict:
    return {"name": name, "status": status, "detail": detail, "verified": verified, "note": note}


HOOKED = entry("batch_probe", "applied", "records formed batches")
UNVERIFIED = entry(
    "batch_probe", "applied", "V2 runner", verified=False, note="unverified on 0.26.0"
)
CANNOT = entry("batch_probe", "skipped", "cannot see batches on this vLLM: ...")
INERT = entry("batch_probe", "skipped", "inert: OPSCTL_PROBES does not contain 'batch'")
API = entry("batch_probe", "skipped", "not needed in the api_server process", verified=False)


@pytest.mark.parametrize(
    ("records", "codes"),
    [
        ([], []),  # no ledger (a server opsctl did not start)
        ([record("worker", "0.32.0", HOOKED)], []),
        ([record("api_server", "0.26.0", API), record("worker", "0.26.0", INERT)], []),
        ([record("worker", "0.26.0", UNVERIFIED)], [(WARNING, "invariance.probe_unverified")]),
        ([record("worker", "0.35.0", CANNOT)], [(FAIL, "invariance.probe_unhooked")]),
        # the EngineCore could not, the Worker (which samples) did: hooked
        ([record("engine_core", "0.32.0", CANNOT), record("worker", "0.32.0", HOOKED)], []),
    ],
)
def test_probe_findings(records, codes) -> None:
    found = pe.probe_findings(records, ("batch",), "invariance")
    assert [(f.severity, f.code) for f in found] == codes


def test_unverified_names_the_release_and_unhooked_says_why() -> None:
    (warn,) = pe.probe_findings([record("worker", "0.26.0", UNVERIFIED)], ["batch"], "lora")
    assert "unverified on vLLM 0.26.0" in warn.message and warn.details["patch"] == "batch_probe"
    (fail,) = pe.probe_findings([record("worker", "0.35.0", CANNOT)], ["batch"], "lora")
    assert "could not hook" in fail.message and "cannot see batches" in fail.message
    assert pe.lines([warn, fail], FAIL) == [f"lora.probe_unhooked: {fail.message}"]


def test_real_ledger_record_of_the_batch_probe_on_an_unverified_release(monkeypatch) -> None:
    """The registry's own record (the probe hooks this vLLM's runner; the release
    passed in is one it was not verified on) gives the unverified warning."""
    monkeypatch.setenv("OPSCTL_PROBES", "batch")
    try:
        rec = apply_patch(batch_probe.PATCH, "worker", "0.26.0")
        ok = apply_patch(batch_probe.PATCH, "worker", "0.32.0")
    finally:
        batch_probe.undo()
    assert rec["status"] == "applied" and rec["verified"] is False
    found = pe.probe_findings([record("worker", "0.26.0", rec)], ["batch"], "invariance")
    assert [f.code for f in found] == ["invariance.probe_unverified"]
    assert pe.probe_findings([record("worker", "0.32.0", ok)], ["batch"], "invariance") == []


def write_ledger(run_dir: Path, *records: dict) -> Path:
    (run_dir / "ledger").mkdir(parents=True)
    for i, rec in enumerate(records):
        (run_dir / "ledger" / f"{i}.json").write_text(json.dumps({**rec, "pid": i, "time": i}))
    return run_dir


def test_checks_read_their_probes_from_the_run_dir(tmp_path) -> None:
    run = write_ledger(
        tmp_path,
        record("worker", "0.26.0", UNVERIFIED, entry("lora_swap_probe", "failed", "boom")),
        record("engine_core", "0.26.0", entry("mm_uuid_probe", "applied", verified=False)),
    )
    inv = invariance.probe_findings(run, images=True)
    assert [f.code for f in inv] == ["invariance.probe_unverified", "invariance.probe_unverified"]
    assert invariance.probe_findings(None, images=False) == []
    passed = DL.Findings(DL.PASS, (), (), DL.PASS)
    found = lora.with_probe_findings(passed, run)
    assert found.verdict == DL.UNVERIFIED  # the lora probe never hooked: cannot pass
    assert any(r.startswith("lora.probe_unhooked") for r in found.reasons)
    assert any(w.startswith("lora.probe_unverified") for w in found.warnings)
    failed = DL.Findings(DL.FAIL, ("x",), (), DL.FAIL)
    assert lora.with_probe_findings(failed, run).verdict == DL.FAIL
    runs = [{"run_dir": str(run)}, {"run_dir": str(run)}]  # caches off and on: once
    assert [f.code for f in mm_uuid.probe_findings(runs)] == ["mm_uuid.probe_unverified"]
