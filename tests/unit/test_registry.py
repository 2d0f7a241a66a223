import json

import pytest

from engine_patches import registry
from engine_patches.registry import APPLIED, FAILED, SKIPPED, Outcome, Patch


@pytest.fixture
def fake_patches(monkeypatch, tmp_path):
    calls = {"good": 0, "bad": 0}

    def good():
        calls["good"] += 1
        return Outcome(APPLIED, "ok")

    def bad():
        calls["bad"] += 1
        raise RuntimeError("target moved")

    plist = [
        Patch("good", "t.good", "any", "why", good, roles=(registry.process_role(),)),
        Patch("bad", "t.bad", "any", "why", bad, roles=(registry.process_role(),)),
        Patch("elsewhere", "t.x", "any", "why", good, roles=("no-such-role",)),
    ]
    monkeypatch.setattr(registry, "patches", lambda: plist)
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("OPSCTL_DISABLE_PATCHES", raising=False)
    registry.reset_for_tests()
    yield calls
    registry.reset_for_tests()


def test_apply_all_is_idempotent_and_never_raises(fake_patches, tmp_path):
    first = registry.apply_all()
    second = registry.apply_all()
    assert fake_patches == {"good": 1, "bad": 1}  # applied once per process
    status = {p["name"]: p["status"] for p in second["patches"]}
    assert status == {"good": APPLIED, "bad": FAILED, "elsewhere": SKIPPED}
    assert "target moved" in next(p for p in first["patches"] if p["name"] == "bad")["detail"]
    ledger = json.loads((tmp_path / "ledger" / f"{first['pid']}.json").read_text())
    assert ledger["role"] == first["role"] and len(ledger["patches"]) == 3


def test_ledger_records_the_active_test_knobs(fake_patches, monkeypatch, tmp_path):
    from engine_patches import knobs

    monkeypatch.setenv(knobs.NUDGE, "zebra:3")
    monkeypatch.delenv(knobs.ENABLE, raising=False)
    rec = registry.apply_all()
    assert rec["test_knobs"] == {}  # not enabled: not honoured, recorded as none
    monkeypatch.setenv(knobs.ENABLE, "1")
    rec = registry.apply_all()
    ledger = json.loads((tmp_path / "ledger" / f"{rec['pid']}.json").read_text())
    assert ledger["test_knobs"] == {knobs.NUDGE: "zebra:3"}


def test_disabled_patch_is_skipped_with_reason(fake_patches, monkeypatch):
    monkeypatch.setenv("OPSCTL_DISABLE_PATCHES", "good")
    rec = registry.apply_all()
    good = next(p for p in rec["patches"] if p["name"] == "good")
    assert good["status"] == SKIPPED and "OPSCTL_DISABLE_PATCHES" in good["detail"]
    assert fake_patches["good"] == 0


def test_plugin_is_inert_without_run_dir(monkeypatch):
    import engine_patches

    called = []
    monkeypatch.delenv("OPSCTL_RUN_DIR", raising=False)
    monkeypatch.setattr(registry, "apply_all", lambda *a, **k: called.append(1))
    engine_patches.register()
    assert called == []


def test_catalog_discovers_real_patches():
    from engine_patches import catalog

    found = catalog.patches()
    names = {p.name for p in found}
    assert {"dummy_constant_fill", "engine_info_probe"} <= names
    for p in found:
        assert p.reason and p.target and p.versions and callable(p.apply)
    assert [p.name for p in registry.patches()] == [p.name for p in found]


def test_registry_imports_without_discovering_and_patches_import_it_first():
    """The registry imports the catalog at module level and the catalog imports the patch
    modules only when asked: importing a patch module first (it imports the registry)
    must work in a fresh interpreter, and so must importing the registry first."""
    import subprocess
    import sys

    for first in ("engine_patches.patches.dummy_fill", "engine_patches.registry"):
        code = (
            f"import importlib; importlib.import_module({first!r})\n"
            "from engine_patches import registry\n"
            "names = [p.name for p in registry.patches()]\n"
            "assert 'dummy_constant_fill' in names, names\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_ledger_platform_is_a_name_or_null_with_a_note(fake_patches, monkeypatch, tmp_path):
    rec = registry.apply_all()
    assert rec["platform"] == "cpu" and rec["platform_note"] is None  # vLLM CPU here
    monkeypatch.setattr(registry, "platform_info", lambda: (None, "no vllm.platforms"))
    registry.reset_for_tests()
    rec = registry.apply_all()
    ledger = json.loads((tmp_path / "ledger" / f"{rec['pid']}.json").read_text())
    assert ledger["platform"] is None and ledger["platform_note"] == "no vllm.platforms"
