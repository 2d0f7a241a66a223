"""Seeded weights written as safetensors with numpy (no torch needed to build)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np


def seeded(name: str, shape: tuple[int, ...], std: float, seed: int) -> np.ndarray:
    """A tensor whose values depend only on (seed, name, shape): stable across builds."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return (rng.standard_normal(shape) * std).astype(np.float32)


def save(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Save ``tensors`` as safetensors at ``path``, in name order."""
    from safetensors.numpy import save_file

    save_file(dict(sorted(tensors.items())), str(path), metadata={"format": "pt"})


def ones(shape: Iterable[int]) -> np.ndarray:
    """A float32 array of ones of ``shape``."""
    return np.ones(tuple(shape), dtype=np.float32)
