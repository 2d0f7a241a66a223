"""Dummy loading fills constants and initialises each tensor once (vLLM PR 56682).

Dummy loading: constant fill via ``dummy_weight_value`` and one init per tensor
(vLLM PR 56682).

Upstream (vLLM >= 0.32 here) ``initialize_single_dummy_weight`` fills a tensor that
carries ``dummy_weight_value`` with that constant before its floating-point check (so
fp8 weights and uint8 ue8m0 scales are covered), and ``DummyModelLoader.load_weights``
initialises only each module's own parameters and persistent buffers instead of
calling ``state_dict()`` (which re-initialised every descendant again).

On an installed vLLM that has both, this reports "already upstream". Otherwise it
wraps the two functions (keeping the originals in ``ORIGINALS`` so tests can undo it).
The single-visit fallback passes each tensor's ``name=`` when the installed
``initialize_single_dummy_weight`` takes it (vLLM >= 0.33: its E8M0 scale branch keys
on the name), so the fallback never loses that branch.
"""

from __future__ import annotations

import inspect
from typing import Any

from engine_patches.patch import APPLIED, UPSTREAM, Outcome, Sources, declare, installed_sources

ORIGINALS: dict[str, Any] = {}


FILL = "vllm.model_executor.model_loader.weight_utils:initialize_single_dummy_weight"
LOAD = "vllm.model_executor.model_loader.dummy_loader:DummyModelLoader.load_weights"
SYMBOLS = (FILL, LOAD)


def rule_parts(sources: Sources) -> tuple[bool, bool]:
    """(constant fill before the float check, single-visit init), from the sources."""
    fill_src, load_src = sources.get(FILL) or "", sources.get(LOAD) or ""
    has_fill = "dummy_weight_value" in fill_src
    # No float check at all (e.g. a wrapper) counts as "before" it.
    float_at = fill_src.find("is_floating_point")
    fill_before_float = has_fill and (
        float_at < 0 or fill_src.index("dummy_weight_value") < float_at
    )
    return fill_before_float, bool(load_src) and not calls_state_dict(load_src)


def upstream_rule(sources: Sources) -> tuple[bool | None, str]:
    """Both halves of PR 56682 upstream? None when a target is missing."""
    missing = [s.rsplit(":", 1)[1] for s in SYMBOLS if sources.get(s) is None]
    if missing:
        return None, "not found: " + ", ".join(missing)
    fill_up, visit_up = rule_parts(sources)
    if fill_up and visit_up:
        return True, "constant fill before float check and single-visit init present"
    lacking = [
        n for n, up in (("constant fill", fill_up), ("single-visit init", visit_up)) if not up
    ]
    return False, "lacks " + ", ".join(lacking)


def upstream_status() -> tuple[bool, bool]:
    """(constant fill upstream, single visit upstream) for the installed vLLM."""
    return rule_parts(installed_sources(SYMBOLS))


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
    """Dummy weight init that honours ``dummy_weight_value`` for every dtype.

    ``initialize_single_dummy_weight`` that fills a tensor carrying
    ``dummy_weight_value`` with that constant (any dtype) and leaves the rest to
    ``original``."""

    def initialize_single_dummy_weight(param, *args, **kwargs):
        value = getattr(param, "dummy_weight_value", None)
        if value is not None and param.device.type != "meta":
            param.fill_(value)
            return None
        return original(param, *args, **kwargs)

    initialize_single_dummy_weight.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize_single_dummy_weight


def accepts_name(init) -> bool:
    """Whether ``initialize_single_dummy_weight`` takes ``name=``.

    vLLM >= 0.33: a uint8 tensor named like a scale holds E8M0 scales and gets a fixed
    exponent. Only
    an explicit ``name`` parameter counts (followed through ``__wrapped__``): a wrapper's
    ``**kwargs`` says nothing about the function it forwards to."""
    try:
        params = inspect.signature(inspect.unwrap(init)).parameters
    except (TypeError, ValueError):
        return False
    return "name" in params


def init_local_tensors(model, init) -> int:
    """Initialise every tensor of ``model`` once; how many were visited.

    Initialise each module's own parameters and persistent buffers once (not the
    descendants ``state_dict()`` would visit again), passing the tensor's name when
    ``init`` takes it, as vLLM >= 0.33's own loader does. Returns the tensors visited."""
    named = accepts_name(init)
    count = 0
    for layer in model.modules():
        local = list(layer.named_parameters(recurse=False)) + [
            (n, b)
            for n, b in layer.named_buffers(recurse=False)
            if n not in getattr(layer, "_non_persistent_buffers_set", set())
        ]
        for name, tensor in local:
            if named:
                init(tensor, name=name)
            else:
                init(tensor)
            count += 1
    return count


def single_visit_load_weights(self, model, model_config) -> None:
    """``DummyModelLoader.load_weights`` that initialises every tensor once."""
    from vllm.model_executor.model_loader import weight_utils

    init_local_tensors(model, weight_utils.initialize_single_dummy_weight)


def apply() -> Outcome:
    """Wrap whichever half of PR 56682 the installed vLLM lacks."""
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
    """Restore both functions (tests)."""
    from vllm.model_executor.model_loader import dummy_loader, weight_utils

    if "fill" in ORIGINALS:
        weight_utils.initialize_single_dummy_weight = ORIGINALS.pop("fill")
        if hasattr(dummy_loader, "initialize_single_dummy_weight"):
            dummy_loader.initialize_single_dummy_weight = (
                weight_utils.initialize_single_dummy_weight
            )
    if "load" in ORIGINALS:
        dummy_loader.DummyModelLoader.load_weights = ORIGINALS.pop("load")  # type: ignore[method-assign]


PATCH = declare(
    "dummy_constant_fill",
    target="vllm.model_executor.model_loader.{weight_utils.initialize_single_dummy_weight,dummy_loader.DummyModelLoader.load_weights}",
    versions="< 0.32 (upstream from 0.32)",
    reason="vLLM PR 56682: dummy_weight_value constant fill (Engram fp8/ue8m0 tables), one init per tensor",
    apply=apply,
    roles=("worker", "engine_core"),
    verified_on=("0.32.0",),
    symbols=SYMBOLS,
    upstream=upstream_rule,
)
