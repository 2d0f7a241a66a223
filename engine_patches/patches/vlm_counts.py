"""Two image-model counts that vLLM before 0.32 gets wrong with transformers 5 (found on
the H200 with CUDA vLLM 0.26.0 and transformers 5.17.0; docs/gpu.md, issue 34 item 5).

- **idefics3_unsplit_patches** (vLLM issue 48667, fixed by PR 48760, upstream in 0.32 as
  ``return max(num_patches, 1)``): transformers 5's Idefics3 image processor says an image
  that is not split into tiles has 0 patches (``get_number_of_image_patches`` returns
  ``(0, 0, 0)``; 4.x said 1). vLLM 0.26 passes that 0 to
  ``MultiModalFieldConfig.flat_from_sizes``, so every unsplit image reaches the model as
  an empty ``pixel_values`` slice and ``Idefics2VisionTransformer.forward`` dies on
  ``patch_attention_mask.view(0, -1)`` ("cannot reshape tensor of 0 elements"): the first
  image request kills the EngineCore, and with the V1 runner the start-up profile run
  does. The HF processor itself emits the one global tile, so the count is clamped to 1.
  Needed in the API server (the processor) and in the EngineCore/worker (the profile
  run's dummy images).
- **blip2_lora_int_tokens**: BLIP-2's ``get_num_mm_encoder_tokens`` and
  ``get_num_mm_connector_tokens`` divide with ``/``, so with tower/connector LoRA the
  token budget LoRA's Punica wrapper is built with is a float and engine start fails in
  ``punica_base.py`` (``torch.empty()`` got a float). The methods assert divisibility, so
  ``int()`` is exact. vLLM 0.32 replaced both with ``get_mm_lora_token_counts`` (``//``).

Each reports "already upstream" where the installed sources have the fix (the rules
below read them; the preflight reads a wheel's the same way). ``revert()`` undoes both.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from engine_patches.patch import Sources, installed_sources
from engine_patches.registry import APPLIED, UPSTREAM, Outcome, Patch

ORIGINALS: dict[str, tuple[type, str, Any]] = {}

IDEFICS3 = "vllm.model_executor.models.idefics3"
NUM_PATCHES = f"{IDEFICS3}:Idefics3ProcessingInfo.get_num_patches"
BLIP2 = "vllm.model_executor.models.blip2"
BLIP2_CLASS = f"{BLIP2}:Blip2ForConditionalGeneration"
BLIP2_COUNTS = tuple(
    f"{BLIP2_CLASS}.{n}" for n in ("get_num_mm_encoder_tokens", "get_num_mm_connector_tokens")
)
_CLAMPED = re.compile(r"max\(\s*num_patches\s*,\s*1\s*\)")
_TRUE_DIV = re.compile(r"num_images\s*=\s*\w+\s*/\s*self\.")  # "/", not "//"


def patches_rule(sources: Sources) -> tuple[bool | None, str]:
    """(True: get_num_patches already clamps | False: it passes 0 on | None: gone)."""
    src = sources.get(NUM_PATCHES)
    if src is None:
        return None, "Idefics3ProcessingInfo.get_num_patches not found"
    if _CLAMPED.search(src):
        return True, "get_num_patches clamps to at least 1"
    return False, "get_num_patches passes the image processor's count on unclamped"


def blip2_rule(sources: Sources) -> tuple[bool | None, str]:
    """(True: integer token counts, or the methods are gone | False: true division |
    None: no BLIP-2), from the class's source."""
    src = sources.get(BLIP2_CLASS)
    if src is None:
        return None, "Blip2ForConditionalGeneration not found"
    if _TRUE_DIV.search(src) and "def get_num_mm_encoder_tokens" in src:
        return False, "BLIP-2's LoRA token counts use true division (floats)"
    if "def get_num_mm_encoder_tokens" not in src:
        return True, "the float-returning methods are gone (0.32: get_mm_lora_token_counts)"
    return True, "BLIP-2's LoRA token counts are integers"


def _wrap(symbol: str, make) -> None:
    module, _, qual = symbol.partition(":")
    cls_name, _, attr = qual.partition(".")
    import importlib

    cls = getattr(importlib.import_module(module), cls_name)
    original = cls.__dict__[attr]
    ORIGINALS[symbol] = (cls, attr, original)
    setattr(cls, attr, functools.wraps(original)(make(original)))


def apply_patches() -> Outcome:
    if NUM_PATCHES in ORIGINALS:
        return Outcome(APPLIED, "already applied in this process")
    handled, why = patches_rule(installed_sources((NUM_PATCHES,)))
    if handled is None:
        return Outcome("skipped", why)
    if handled:
        return Outcome(UPSTREAM, why)
    _wrap(NUM_PATCHES, lambda original: lambda self, *a, **k: max(int(original(self, *a, **k)), 1))
    return Outcome(APPLIED, f"an unsplit Idefics3 image counts as 1 patch ({why})")


def apply_blip2() -> Outcome:
    if BLIP2_COUNTS[0] in ORIGINALS:
        return Outcome(APPLIED, "already applied in this process")
    handled, why = blip2_rule(installed_sources((BLIP2_CLASS,)))
    if handled is None:
        return Outcome("skipped", why)
    if handled:
        return Outcome(UPSTREAM, why)
    for symbol in BLIP2_COUNTS:
        _wrap(symbol, lambda original: lambda self, *a, **k: int(original(self, *a, **k)))
    return Outcome(APPLIED, f"BLIP-2's LoRA token counts are integers ({why})")


def revert() -> None:
    """Undo both patches in this process (tests)."""
    for symbol in list(ORIGINALS):
        cls, attr, original = ORIGINALS.pop(symbol)
        setattr(cls, attr, original)


PATCHES = (
    Patch(
        name="idefics3_unsplit_patches",
        target="vllm.model_executor.models.idefics3.Idefics3ProcessingInfo.get_num_patches",
        versions="vLLM < 0.32 with transformers >= 5 (upstream from 0.32)",
        reason="issue 48667 / PR 48760: an unsplit Idefics3 image counted 0 patches and "
        "killed the EngineCore on the first image request",
        apply=apply_patches,
        roles=("api_server", "engine_core", "worker"),
        verified_on=("0.26.0", "0.32.0"),
        symbols=(NUM_PATCHES,),
        upstream=patches_rule,
    ),
    Patch(
        name="blip2_lora_int_tokens",
        target="vllm.model_executor.models.blip2.Blip2ForConditionalGeneration.get_num_mm_encoder_tokens",
        versions="vLLM < 0.32 (upstream from 0.32: get_mm_lora_token_counts with //)",
        reason="BLIP-2 tower/connector LoRA built its Punica wrapper with a float token "
        "budget: engine start failed",
        apply=apply_blip2,
        roles=("engine_core", "worker"),
        verified_on=("0.26.0", "0.32.0"),
        symbols=(BLIP2_CLASS,),
        upstream=blip2_rule,
    ),
)
