"""aot_cache_load against vLLM's real AOT loader and a real torch artifact (no engine).

A function compiled ahead of time with stock inductor (vLLM's CPU path) and saved as
vLLM saves it: vLLM 0.32's ``_try_load_aot_compiled_fn`` logs "Compiling model again due
to a load failure" and returns None; with the patch it returns the loaded function, which
computes what the function does; after ``revert()`` the load fails again.
"""

from __future__ import annotations

import types

import pytest
import torch

from engine_patches.patch import installed_sources
from engine_patches.patches import aot_cache_load as patch
from engine_patches.registry import APPLIED, SKIPPED, UPSTREAM


def scaled_silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x) * 2 + 1


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> str:
    """A real AOT artifact of ``scaled_silu``, compiled by stock inductor and saved."""
    x = torch.randn(4, 8)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(scaled_silu, fullgraph=True, backend="inductor").aot_compile(
            ((x,), {})
        )
    path = str(tmp_path_factory.mktemp("aot") / "model")
    compiled.save_compiled_function(path)
    return path


@pytest.fixture
def model():
    """What vLLM's loader reads of a compiled model: its config, tag and forward."""
    from vllm.config import VllmConfig

    cfg = VllmConfig()
    return types.SimpleNamespace(
        vllm_config=cfg,
        compilation_config=cfg.compilation_config,
        _is_encoder=False,
        _compile_tag="",
        forward=scaled_silu,
    )


def test_vllms_loader_takes_torchs_artifact_only_with_the_patch(artifact, model):
    from vllm.compilation import decorators

    assert decorators._try_load_aot_compiled_fn(model, artifact) is None  # vLLM 0.32 as is
    try:
        outcome = patch.apply()
        assert outcome.status == APPLIED, outcome
        assert "finalize_loading on every loaded artifact" in outcome.detail
        assert patch.apply().status == APPLIED  # idempotent: vLLM may load plugins again
        loaded = decorators._try_load_aot_compiled_fn(model, artifact)
        assert loaded is not None
        x = torch.randn(4, 8)
        assert torch.equal(loaded(x), scaled_silu(x))
    finally:
        patch.revert()
    assert "finalize_loading" not in vars(patch._torch_callable())
    assert decorators._try_load_aot_compiled_fn(model, artifact) is None


def test_the_rule_reads_the_installed_loader_as_unfixed():
    handled, why = patch.loader_rule(installed_sources([patch.LOADER]))
    assert handled is False, why


@pytest.mark.parametrize(
    ("src", "handled"),
    [
        (None, None),
        ("def f(m, p):\n    fn._artifacts.compiled_fn.finalize_loading(m.vllm_config)\n", False),
        (
            "def f(m, p):\n    c = fn._artifacts.compiled_fn\n"
            "    if hasattr(c, 'finalize_loading'):\n        c.finalize_loading(m.vllm_config)\n",
            True,
        ),
        ("def f(m, p):\n    return torch.compiler.load_compiled_function(p)\n", True),
    ],
)
def test_the_rule_on_each_shape_of_loader(src, handled):
    assert patch.loader_rule({patch.LOADER: src})[0] is handled


def test_a_torch_callable_with_the_method_is_upstream_and_none_is_skipped(monkeypatch):
    class Fixed:
        def finalize_loading(self, vllm_config) -> None: ...

    monkeypatch.setattr(patch, "_torch_callable", lambda: Fixed)
    assert patch.apply().status == UPSTREAM
    monkeypatch.setattr(patch, "_torch_callable", lambda: None)
    assert patch.apply().status == SKIPPED
