"""Dummy-init time of deep module trees: one visit per tensor (vLLM 0.32's
DummyModelLoader, PR 56682) vs the old way (``state_dict()`` of every module, which
re-initialises every descendant again). Prints both times and the ratio.

    .venv/bin/python benchmarks/dummy_load.py
"""

from __future__ import annotations

import time

import torch
from torch import nn


class Chain(nn.Module):
    """A chain ``depth`` modules deep, each with its own small weight."""

    def __init__(self, depth: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width, width), requires_grad=False)
        self.child = Chain(depth - 1, width) if depth > 1 else None


class Layer(nn.Module):
    """A decoder-like layer: attention (4 linears) + MLP (3 linears) + 2 norms, 3 deep."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.ModuleDict(
            {k: nn.Linear(width, width, bias=False) for k in ("q", "k", "v", "o")}
        )
        self.mlp = nn.ModuleDict(
            {k: nn.Linear(width, width, bias=False) for k in ("gate", "up", "down")}
        )
        self.norms = nn.ModuleList([nn.LayerNorm(width), nn.LayerNorm(width)])


def recursive_init(model: nn.Module, init) -> int:
    n = 0
    for module in model.modules():
        for tensor in module.state_dict().values():
            init(tensor)
            n += 1
    return n


def timed(fn) -> tuple[float, int]:
    started = time.perf_counter()
    n = fn()
    return time.perf_counter() - started, n


def main() -> None:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    init = weight_utils.initialize_single_dummy_weight
    loader = dummy_loader.DummyModelLoader(LoadConfig(load_format="dummy"))
    counts = {"n": 0}

    def counting(t, *a, **k):
        counts["n"] += 1
        return init(t, *a, **k)

    dummy_loader.initialize_single_dummy_weight = counting
    try:
        for label, model in (
            ("chain, 300 modules deep, 64x64 each", Chain(300, 64)),
            ("48 decoder-like layers, width 256", nn.Sequential(*[Layer(256) for _ in range(48)])),
        ):

            def one_visit(model=model):
                counts["n"] = 0
                loader.load_weights(model, model_config=None)
                return counts["n"]

            t1, n1 = timed(one_visit)
            t2, n2 = timed(lambda model=model: recursive_init(model, init))
            print(f"{label}:")
            print(
                f"  one visit per tensor (vLLM DummyModelLoader): {t1 * 1e3:9.1f} ms  ({n1} inits)"
            )
            print(
                f"  recursive state_dict() per module (old):      {t2 * 1e3:9.1f} ms  ({n2} inits)"
            )
            print(f"  ratio old/new: {t2 / t1:.1f}x")
    finally:
        dummy_loader.initialize_single_dummy_weight = init


if __name__ == "__main__":
    main()
