"""dummy_constant_fill patch against vLLM's real DummyModelLoader (no engine start).

- On vLLM 0.32 (upstream has PR 56682) the patch reports "already upstream" and the
  real loader fills a dummy_weight_value parameter with its constant (fp8 e4m3 1.0 =
  byte 0x38, ue8m0 scale 127) and initialises every tensor exactly once.
- Against a simulated old loader (recursive ``state_dict()`` walk, no constant branch)
  apply() brings both back, and undo() restores the old functions.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from vllm.model_executor.model_loader import dummy_loader, weight_utils

from engine_patches.patches import dummy_fill
from engine_patches.registry import APPLIED, UPSTREAM


class EngramLike(nn.Module):
    """A CPU-offloaded Engram table's two parameters, as ParallelEngramEmbedding makes them."""

    def __init__(self, rows: int = 8, dim: int = 256) -> None:
        from vllm.model_executor.utils import set_weight_attrs

        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(rows, dim, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        self.weight_scale_inv = nn.Parameter(
            torch.empty(rows, dim // 128, dtype=torch.uint8), requires_grad=False
        )
        set_weight_attrs(self.weight, {"dummy_weight_value": 1.0})
        set_weight_attrs(self.weight_scale_inv, {"dummy_weight_value": 127})
        self.register_buffer("persistent", torch.zeros(4))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)


class Block(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.child = Block(depth - 1) if depth > 1 else EngramLike()


def tree() -> nn.Module:
    return nn.Sequential(Block(4), nn.LayerNorm(8))


def run_loader(model: nn.Module, monkeypatch) -> Counter:
    """Run the real DummyModelLoader, counting initialize_single_dummy_weight per tensor."""
    from vllm.config.load import LoadConfig

    counts: Counter = Counter()
    inner = weight_utils.initialize_single_dummy_weight

    def counting(param, *args, **kwargs):
        counts[param.data_ptr()] += 1  # state_dict() hands out detached views: key by storage
        return inner(param, *args, **kwargs)

    monkeypatch.setattr(weight_utils, "initialize_single_dummy_weight", counting)
    monkeypatch.setattr(dummy_loader, "initialize_single_dummy_weight", counting)
    loader = dummy_loader.DummyModelLoader(LoadConfig(load_format="dummy"))
    loader.load_weights(model, model_config=None)  # model_config is not used by load_weights
    monkeypatch.setattr(weight_utils, "initialize_single_dummy_weight", inner)
    monkeypatch.setattr(dummy_loader, "initialize_single_dummy_weight", inner)
    return counts


def engram_of(model: nn.Module) -> EngramLike:
    return next(m for m in model.modules() if isinstance(m, EngramLike))


def expected_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for _, t in model.named_parameters()] + [
        t for n, t in model.named_buffers() if "scratch" not in n
    ]


def assert_constant_and_single_visit(model: nn.Module, counts: Counter) -> None:
    e = engram_of(model)
    assert bool((e.weight.data.view(torch.uint8) == 0x38).all())  # fp8 e4m3 1.0
    assert float(e.weight.data.float().min()) == float(e.weight.data.float().max()) == 1.0
    assert bool((e.weight_scale_inv.data == 127).all())  # ue8m0 2^0
    for t in expected_tensors(model):
        assert counts[t.data_ptr()] == 1, (
            f"tensor {tuple(t.shape)} initialised {counts[t.data_ptr()]} times"
        )
    assert (
        counts[e.scratch.data_ptr()] == 0
    )  # non-persistent buffers are skipped, as state_dict() would
    assert len(counts) == len(expected_tensors(model))


def test_upstream_detected_on_installed_vllm():
    fill_up, visit_up = dummy_fill.upstream_status()
    assert (fill_up, visit_up) == (True, True)
    before = (
        weight_utils.initialize_single_dummy_weight,
        dummy_loader.DummyModelLoader.load_weights,
    )
    outcome = dummy_fill.apply()
    assert outcome.status == UPSTREAM
    assert not dummy_fill.ORIGINALS
    assert (
        weight_utils.initialize_single_dummy_weight,
        dummy_loader.DummyModelLoader.load_weights,
    ) == before


def test_real_dummy_loader_constant_fill_and_one_init_per_tensor(monkeypatch):
    model = tree()
    counts = run_loader(model, monkeypatch)
    assert_constant_and_single_visit(model, counts)
    w = model[0].proj.weight.detach()
    assert (
        float(w.abs().max()) <= 1e-3 and float(w.abs().max()) > 0
    )  # random dummy values elsewhere


# ---- a simulated vLLM without PR 56682 ---------------------------------------------------------


def old_initialize_single_dummy_weight(param, low=-1e-3, high=1e-3, seed=1234):
    if not torch.is_floating_point(param):
        return
    generator = torch.Generator(device=param.data.device)
    generator.manual_seed(seed)
    if param.dtype.itemsize == 1:  # fp8: uniform_ is not implemented, go through fp16
        tmp = torch.empty(param.shape, dtype=torch.float16, device=param.device)
        param.data.copy_(tmp.uniform_(low, high, generator=generator))
    else:
        param.data.uniform_(low, high, generator=generator)


def old_load_weights(self, model, model_config):
    for module in model.modules():
        for tensor in module.state_dict().values():  # re-initialises every descendant again
            dummy_loader.initialize_single_dummy_weight(tensor)


@pytest.fixture
def old_vllm(monkeypatch):
    monkeypatch.setattr(
        weight_utils, "initialize_single_dummy_weight", old_initialize_single_dummy_weight
    )
    monkeypatch.setattr(
        dummy_loader, "initialize_single_dummy_weight", old_initialize_single_dummy_weight
    )
    monkeypatch.setattr(dummy_loader.DummyModelLoader, "load_weights", old_load_weights)
    dummy_fill.ORIGINALS.clear()
    yield
    dummy_fill.undo()


def test_simulated_old_loader_is_what_the_patch_fixes(old_vllm, monkeypatch):
    assert dummy_fill.upstream_status() == (False, False)
    model = tree()
    counts = run_loader(model, monkeypatch)
    e = engram_of(model)
    assert not bool((e.weight.data.view(torch.uint8) == 0x38).all())  # no constant fill
    assert counts[e.weight.data_ptr()] > 1  # state_dict() of every ancestor visits it again


def test_apply_then_undo_on_old_loader(old_vllm, monkeypatch):
    outcome = dummy_fill.apply()
    assert (
        outcome.status == APPLIED
        and "constant fill" in outcome.detail
        and "single-visit" in outcome.detail
    )
    assert dummy_fill.apply().status == APPLIED  # idempotent: a second call changes nothing
    assert (
        weight_utils.initialize_single_dummy_weight.__wrapped__
        is old_initialize_single_dummy_weight
    )
    assert (
        dummy_loader.initialize_single_dummy_weight is weight_utils.initialize_single_dummy_weight
    )
    model = tree()
    counts = run_loader(model, monkeypatch)
    assert_constant_and_single_visit(model, counts)
    dummy_fill.undo()
    assert not dummy_fill.ORIGINALS
    assert weight_utils.initialize_single_dummy_weight is old_initialize_single_dummy_weight
    assert dummy_loader.initialize_single_dummy_weight is old_initialize_single_dummy_weight
    assert dummy_loader.DummyModelLoader.load_weights is old_load_weights
