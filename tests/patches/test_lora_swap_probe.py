"""The lora probe and the OPSCTL_LORA_SWAP test knob (engine_patches/patches/
lora_swap_probe.py) without an engine: inert unless asked, honoured only through
engine_patches.knobs, idempotent, undoable, and the swap touches two requests with
different adapters only when they are batched together (vLLM 0.32's real InputBatch
.make_lora_inputs runs on a stand-in batch)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine_patches import knobs
from engine_patches.patches import lora_swap_probe as P
from engine_patches.registry import APPLIED, SKIPPED
from opsctl.collectors.ledger import read_events
from tests.standins.patch_env import clean_patch_env


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    clean_patch_env(monkeypatch, tmp_path, knobs.ENABLE, knobs.LORA_SWAP)
    yield
    P.undo()


def test_inert_unless_probe_or_knob(monkeypatch) -> None:
    out = P.apply()
    assert out.status == SKIPPED and "inert" in out.detail
    # a stray knob without OPSCTL_TEST_KNOBS=1 is not honoured
    monkeypatch.setenv(knobs.LORA_SWAP, "all")
    assert P.apply().status == SKIPPED
    assert knobs.LORA_SWAP in knobs.KNOBS


@pytest.mark.parametrize(
    "value,scope", [(None, None), ("", None), ("lm", "lm"), ("Tower", "tower"), ("1", "all")]
)
def test_swap_scope(value, scope) -> None:
    assert P.swap_scope(value) == scope


@pytest.mark.parametrize(
    "ids,pair", [([0, 3, 3, 5], (1, 3)), ([2, 1], (0, 1)), ([0, 3, 0], (0, 1)), ([4, 4, 0], (0, 2))]
)
def test_pick_pair_prefers_two_adapters(ids, pair) -> None:
    assert P.pick_pair(ids) == pair
    assert P.pick_pair([2, 2]) is None and P.pick_pair([0]) is None


def batch(ids: list[int]):
    """A stand-in InputBatch for vLLM's own make_lora_inputs."""
    return SimpleNamespace(
        num_reqs=len(ids),
        req_ids=[f"r{i}" for i in range(len(ids))],
        request_lora_mapping=np.array([*ids, 0, 0], dtype=np.int64),
        lora_id_to_lora_request={i: f"lora{i}" for i in ids if i},
    )


def test_lm_swap_only_in_a_mixed_batch(monkeypatch, tmp_path) -> None:
    from vllm.v1.worker.gpu_input_batch import InputBatch

    original = InputBatch.make_lora_inputs
    monkeypatch.setenv(knobs.ENABLE, "1")
    monkeypatch.setenv(knobs.LORA_SWAP, "lm")
    out = P.apply()
    assert out.status == APPLIED and "TEST KNOB OPSCTL_LORA_SWAP=lm" in out.detail
    assert InputBatch.make_lora_inputs is not original
    sched, sampled = np.array([3, 1, 2]), np.array([1, 1, 1])
    b = batch([1, 2, 0])
    prompt, tokens, _ = InputBatch.make_lora_inputs(b, sched, sampled)
    assert prompt == (2, 1, 0) and tokens == (2, 2, 2, 1, 0, 0)
    assert list(b.request_lora_mapping[:3]) == [1, 2, 0]  # restored after the call
    alone = batch([1])
    assert InputBatch.make_lora_inputs(alone, np.array([4]), np.array([1]))[1] == (1,) * 4
    swaps = [e for e in read_events(tmp_path, "lora") if e["event"] == "swap"]
    assert swaps == [{**swaps[0], "scope": "lm", "req_ids": ["r0", "r1"], "lora_ids": [1, 2, 0]}]
    assert "already" not in P.apply().detail  # idempotent: still one wrapper
    assert InputBatch.make_lora_inputs.__wrapped__ is original  # type: ignore[attr-defined]
    P.undo()
    assert InputBatch.make_lora_inputs is original


def test_probe_records_encoder_calls_without_swapping(monkeypatch, tmp_path) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.setenv("OPSCTL_PROBES", "batch,lora")
    original = GPUModelRunner._execute_mm_encoder
    assert P.apply().status == APPLIED
    seen = []
    wrapped = P._wrap_encoder(
        lambda self, so: seen.append(list(self.input_batch.request_lora_mapping[:3])), True, False
    )
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(
            req_id_to_index={"a": 0, "b": 1, "c": 2}, request_lora_mapping=np.array([1, 2, 0])
        )
    )
    wrapped(runner, SimpleNamespace(scheduled_encoder_inputs={"a": [0], "c": [0, 1]}))
    assert seen == [[1, 2, 0]]
    encoder = [e for e in read_events(tmp_path, "lora") if e["event"] == "encoder"]
    assert [e["lora_ids"] for e in encoder] == [[1, 0]]
    tower = P._wrap_encoder(
        lambda self, so: seen.append(list(self.input_batch.request_lora_mapping[:3])), False, True
    )
    tower(runner, SimpleNamespace(scheduled_encoder_inputs={"a": [0], "b": [0]}))
    assert seen[-1] == [2, 1, 0] and list(runner.input_batch.request_lora_mapping) == [1, 2, 0]
    assert GPUModelRunner._execute_mm_encoder is not original
    P.undo()
    assert GPUModelRunner._execute_mm_encoder is original


def test_part_of_uses_the_models_mm_prefixes() -> None:
    mapping = SimpleNamespace(
        language_model=["model.text_model"],
        tower_model=["model.vision_model"],
        connector=["model.connector"],
    )
    assert P.part_of("model.vision_model.encoder.layers.0.mlp.fc1", mapping) == "tower"
    assert P.part_of("model.connector.modality_projection.proj", mapping) == "connector"
    assert P.part_of("model.text_model.layers.0.self_attn.qkv_proj", mapping) == "language"
    assert P.part_of("lm_head", mapping) == "other"
    assert P.part_of("model.layers.0.mlp.down_proj", None) == "language"
