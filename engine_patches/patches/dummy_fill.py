"""Dummy loading: constant fill via ``dummy_weight_value`` and one init per tensor
(vLLM PR 56682).

Upstream (vLLM >= 0.32 here) ``initialize_single_dummy_weight`` fills a tensor that
carries ``dummy_weight_value`` with that constant before its floating-point check (so
fp8 weights and uint8 ue8m0 scales are covered), and ``DummyModelLoader.load_weights``
initialises only each module's own parameters and persistent buffers instead of
calling ``state_dict()`` (which re-initialised every descendant again).

On an installed vLLM that has both, this reports "already upstream". Otherwise it
wraps the two functions (keeping the originals in ``ORIGINALS`` so tests can undo it).
"""

from __future__ import annotations

import inspect
from typing import Any

from engine_patches.registry import APPLIED, UPSTREAM, Outcome, Patch

ORIGINALS: dict[str, Any] = {}


def upstream_status() -> tuple[bool, bool]:
    """(constant fill upstream, single visit upstream) for the installed vLLM."""
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    fill_src = inspect.getsource(weight_utils.initialize_single_dummy_weight)
    load_src = inspect.getsource(dummy_loader.DummyModelLoader.load_weights)
    has_fill = "dummy_weight_value" in fill_src
    # No float check at all (e.g. a wrapper) counts as "before" it.
    float_at = fill_src.find("is_floating_point")
    fill_before_float = has_fill and (
        float_at < 0 or fill_src.index("dummy_weight_value") < float_at
    )
    return fill_before_float, not calls_state_dict(load_src)


def calls_state_dict(source: str) -> bool:
    """Whether code (not comments) calls ``.state_dict()``."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "state_dict"
        for n in ast.walk(tree)
    )


def constant_fill_init(original):
    def initialize_single_dummy_weight(param, *args, **kwargs):
        value = getattr(param, "dummy_weight_value", None)
        if value is not None and param.device.type != "meta":
            param.fill_(value)
            return None
        return original(param, *args, **kwargs)

    initialize_single_dummy_weight.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_single_dummy_weight


def single_visit_load_weights(self, model, model_config) -> None:
    from vllm.model_executor.model_loader import weight_utils

    for layer in model.modules():
        local = list(layer.named_parameters(recurse=False)) + [
            (n, b)
            for n, b in layer.named_buffers(recurse=False)
            if n not in getattr(layer, "_non_persistent_buffers_set", set())
        ]
        for _name, tensor in local:
            weight_utils.initialize_single_dummy_weight(tensor)


def apply() -> Outcome:
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    if ORIGINALS:  # applied earlier in this process (vLLM may call plugins more than once)
        return Outcome(APPLIED, "already applied in this process: " + ", ".join(sorted(ORIGINALS)))
    fill_up, visit_up = upstream_status()
    if fill_up and visit_up:
        return Outcome(UPSTREAM, "constant fill before float check and single-visit init present")
    done = []
    if not fill_up:
        ORIGINALS["fill"] = weight_utils.initialize_single_dummy_weight
        wrapped = constant_fill_init(weight_utils.initialize_single_dummy_weight)
        weight_utils.initialize_single_dummy_weight = wrapped
        if hasattr(dummy_loader, "initialize_single_dummy_weight"):
            dummy_loader.initialize_single_dummy_weight = wrapped
        done.append("constant fill")
    if not visit_up:
        ORIGINALS["load"] = dummy_loader.DummyModelLoader.load_weights
        dummy_loader.DummyModelLoader.load_weights = single_visit_load_weights  # type: ignore[method-assign]
        done.append("single-visit init")
    return Outcome(APPLIED, ", ".join(done))


def undo() -> None:
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    if "fill" in ORIGINALS:
        weight_utils.initialize_single_dummy_weight = ORIGINALS.pop("fill")
        if hasattr(dummy_loader, "initialize_single_dummy_weight"):
            dummy_loader.initialize_single_dummy_weight = (
                weight_utils.initialize_single_dummy_weight
            )
    if "load" in ORIGINALS:
        dummy_loader.DummyModelLoader.load_weights = ORIGINALS.pop("load")  # type: ignore[method-assign]


PATCH = Patch(
    name="dummy_constant_fill",
    target="vllm.model_executor.model_loader.{weight_utils.initialize_single_dummy_weight,dummy_loader.DummyModelLoader.load_weights}",
    versions="< 0.32 (upstream from 0.32)",
    reason="vLLM PR 56682: dummy_weight_value constant fill (Engram fp8/ue8m0 tables), one init per tensor",
    apply=apply,
    roles=("worker", "engine_core"),
)
