"""The mm_uuid engine probe without an engine: inert unless requested, records what it
forwards, and the test-only rewrite knob touches exactly the armed UUID."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from engine_patches import knobs
from engine_patches.patches import mm_uuid_probe as P
from engine_patches.registry import APPLIED, SKIPPED


@dataclass
class Feature:
    identifier: str
    mm_hash: str | None
    modality: str = "image"
    data: object = None
    mm_position: object = None


def test_inert_unless_requested(monkeypatch) -> None:
    monkeypatch.delenv("OPSCTL_PROBES", raising=False)
    out = P.apply()
    assert out.status == SKIPPED and "OPSCTL_PROBES=mm_uuid" in out.detail
    monkeypatch.setenv("OPSCTL_PROBES", "batch,other")
    assert P.apply().status == SKIPPED


def test_applies_once_and_undoes(monkeypatch) -> None:
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.preprocess_add_request
    monkeypatch.setenv("OPSCTL_PROBES", "batch,mm_uuid")
    try:
        assert P.apply().status == APPLIED
        assert EngineCore.preprocess_add_request is not original
        assert "already applied" in P.apply().detail
    finally:
        P.undo()
    assert EngineCore.preprocess_add_request is original


def test_wrapper_records_and_rewrites_only_the_armed_uuid(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(P.REWRITE_ENV, "armed")
    monkeypatch.setenv(knobs.ENABLE, "1")
    feats = [
        Feature("armed", "armed"),
        Feature("kept", "kept"),
        Feature("renderer0-mm-1-image-0", None),
    ]
    request = SimpleNamespace(request_id="r-1", mm_features=feats)
    seen = {}

    def original(self, req):
        seen["ids"] = [f.identifier for f in req.mm_features]
        return SimpleNamespace(mm_features=req.mm_features), 0

    result = P.wrap(original)(object(), request)
    assert result[1] == 0
    assert seen["ids"] == [
        "armed~rewritten",
        "kept",
        "renderer0-mm-1-image-0",
    ]  # forwarded rewritten
    (line,) = (tmp_path / "events" / "mm_uuid.jsonl").read_text().splitlines()
    ev = json.loads(line)
    assert ev["request_id"] == "r-1" and ev["test_rewrites"] == 1
    assert [i["identifier"] for i in ev["items"]] == seen["ids"]


def test_requests_without_images_are_not_recorded(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    monkeypatch.delenv(P.REWRITE_ENV, raising=False)
    P.wrap(lambda self, req: (req, 0))(object(), SimpleNamespace(request_id="t", mm_features=None))
    assert not (tmp_path / "events" / "mm_uuid.jsonl").exists()


@pytest.mark.parametrize("enable", [None, "0", "true"])
def test_rewrite_knob_without_the_enable_switch_changes_nothing(monkeypatch, tmp_path, enable):
    """A stray ``export OPSCTL_MM_UUID_REWRITE=...`` (no OPSCTL_TEST_KNOBS=1) is ignored."""
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(P.REWRITE_ENV, "armed")
    if enable is None:
        monkeypatch.delenv(knobs.ENABLE, raising=False)
    else:
        monkeypatch.setenv(knobs.ENABLE, enable)
    request = SimpleNamespace(request_id="r-2", mm_features=[Feature("armed", "armed")])
    P.wrap(lambda self, req: (req, 0))(object(), request)
    assert request.mm_features[0].identifier == "armed"
    (line,) = (tmp_path / "events" / "mm_uuid.jsonl").read_text().splitlines()
    ev = json.loads(line)
    assert "test_rewrites" not in ev and ev["items"][0]["identifier"] == "armed"
