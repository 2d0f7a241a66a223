"""Declared versions: every patch and probe says which vLLM releases it was verified on,
and the ledger record says whether this vLLM is one of them (never silently)."""

from __future__ import annotations

import pytest

from engine_patches import catalog, registry
from engine_patches.patch import APPLIED, SKIPPED, Outcome, Patch, release, verification


def _patch(apply, verified_on=("0.32.0",)):
    return Patch("p", "t", "0.32", "why", apply, roles=("r",), verified_on=verified_on)


@pytest.mark.parametrize(
    ("version", "verified", "note"),
    [
        ("0.32.0", True, None),
        ("0.32.0+cpu", True, None),
        ("0.33.0", False, "unverified on 0.33.0"),
        (None, None, "vLLM version unknown: cannot tell whether this was verified on it"),
    ],
)
def test_verification(version, verified, note):
    assert verification(_patch(lambda: Outcome(APPLIED)), version) == (verified, note)


def test_release_drops_the_local_part():
    assert release("0.34.0+cu129") == "0.34.0" and release("") is None


def test_unverified_release_is_still_applied_and_says_so(monkeypatch):
    calls = []

    def apply():
        calls.append(1)
        return Outcome(APPLIED, "wrapped")

    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)
    rec = registry.apply_patch(_patch(apply), "r", "0.33.0")
    assert calls == [1]
    assert rec["status"] == APPLIED
    assert rec["verified"] is False and rec["note"] == "unverified on 0.33.0"
    assert rec["verified_on"] == ["0.32.0"]


def test_unverified_release_with_a_missing_target_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)
    patch = _patch(lambda: Outcome(SKIPPED, "Scheduler._handle_invalid_blocks not found"))
    rec = registry.apply_patch(patch, "r", "0.34.0")
    assert rec["status"] == SKIPPED and "not found" in rec["detail"]
    assert rec["verified"] is False and rec["note"] == "unverified on 0.34.0"


def test_verified_release_has_no_note(monkeypatch):
    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)
    rec = registry.apply_patch(_patch(lambda: Outcome(APPLIED)), "r", "0.32.0")
    assert rec["verified"] is True and rec["note"] is None


def test_apply_all_records_verification_of_the_running_vllm(monkeypatch, tmp_path):
    plist = [_patch(lambda: Outcome(APPLIED))]
    plist = [Patch(**{**p.__dict__, "roles": (registry.process_role(),)}) for p in plist]
    monkeypatch.setattr(registry, "patches", lambda: plist)
    monkeypatch.setattr(registry, "vllm_version", lambda: "0.33.0")
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)
    registry.reset_for_tests()
    try:
        rec = registry.apply_all()
    finally:
        registry.reset_for_tests()
    assert rec["vllm_version"] == "0.33.0"
    assert rec["patches"][0]["note"] == "unverified on 0.33.0"


def test_every_real_patch_declares_what_a_preflight_needs():
    for patch in catalog.patches():
        assert patch.verified_on, patch.name
        assert patch.symbols and all(":" in s for s in patch.symbols + patch.watch), patch.name
        assert patch.kind in ("patch", "probe"), patch.name
    fixes = {p.name for p in catalog.patches() if p.upstream is not None}
    assert fixes == {
        "aot_cache_load",
        "dummy_constant_fill",
        "kv_hybrid_recompute",
        "kv_async_inflight",
        "kv_rewind_v2",
        "idefics3_unsplit_patches",
        "blip2_lora_int_tokens",
        "mm_uuid_keep",
    }


def test_a_patch_whose_target_is_missing_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)

    def apply():
        import json

        return json.no_such_function()

    gone = Patch(**{**_patch(apply).__dict__, "symbols": ("json:dumps", "json:no_such_function")})
    rec = registry.apply_patch(gone, "r", "0.34.0")
    assert rec["status"] == SKIPPED
    assert rec["detail"].startswith("target not in this vLLM: json:no_such_function")
    present = Patch(**{**gone.__dict__, "symbols": ("json:dumps",)})
    assert registry.apply_patch(present, "r", "0.34.0")["status"] == "failed"  # a real failure
