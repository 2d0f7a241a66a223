"""Two image-model counts vLLM before 0.32 gets wrong with transformers 5.

Found on the H200 with CUDA vLLM 0.26.0 and transformers 5.17.0 (docs/gpu.md, issue 34
item 5).

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

from engine_patches.patch import (
    APPLIED,
    Outcome,
    Sources,
    UpstreamRule,
    declare,
    resolve_symbol,
)
from engine_patches.wrapping import ALREADY, Originals, decide_upstream

ORIGINALS = Originals()
MARK = "_opsctl_vlm_counts"

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
    """Whether BLIP-2's LoRA token counts are integers, from the class's source.

    (True: integer token counts, or the methods are gone | False: true division |
    None: no BLIP-2), from the class's source."""
    src = sources.get(BLIP2_CLASS)
    if src is None:
        return None, "Blip2ForConditionalGeneration not found"
    if _TRUE_DIV.search(src) and "def get_num_mm_encoder_tokens" in src:
        return False, "BLIP-2's LoRA token counts use true division (floats)"
    if "def get_num_mm_encoder_tokens" not in src:
        return True, "the float-returning methods are gone (0.32: get_mm_lora_token_counts)"
    return True, "BLIP-2's LoRA token counts are integers"


def _at_least_one(original):
    """Idefics3's patch count, clamped to at least 1."""

    @functools.wraps(original)
    def get_num_patches(self, *args, **kwargs):
        return max(int(original(self, *args, **kwargs)), 1)

    return get_num_patches


def _as_int(original):
    """A BLIP-2 LoRA token count as an integer (the method asserts divisibility)."""

    @functools.wraps(original)
    def count(self, *args, **kwargs):
        return int(original(self, *args, **kwargs))

    return count


def _apply(
    rule: UpstreamRule, source: str, targets: tuple[str, ...], wrapper, done: str
) -> Outcome:
    """Wrap each of ``targets`` with ``wrapper`` unless ``rule`` finds the fix in the
    installed source of ``source``."""
    if targets[0] in ORIGINALS:
        return ALREADY
    outcome, why = decide_upstream(rule, (source,))
    if outcome is not None:
        return outcome
    for symbol in targets:
        owner, _, attr = symbol.rpartition(".")
        ORIGINALS.wrap(resolve_symbol(owner), attr, wrapper, MARK, key=symbol)
    return Outcome(APPLIED, f"{done} ({why})")


def apply_patches() -> Outcome:
    """Clamp Idefics3's patch count of an unsplit image to at least 1."""
    return _apply(
        patches_rule,
        NUM_PATCHES,
        (NUM_PATCHES,),
        _at_least_one,
        "an unsplit Idefics3 image counts as 1 patch",
    )


def apply_blip2() -> Outcome:
    """Make BLIP-2's LoRA token counts integers."""
    return _apply(
        blip2_rule, BLIP2_CLASS, BLIP2_COUNTS, _as_int, "BLIP-2's LoRA token counts are integers"
    )


def revert() -> None:
    """Undo both patches in this process (tests)."""
    ORIGINALS.restore()


PATCHES = (
    declare(
        "idefics3_unsplit_patches",
        versions="vLLM < 0.32 with transformers >= 5 (upstream from 0.32)",
        reason="issue 48667 / PR 48760: an unsplit Idefics3 image counted 0 patches and "
        "killed the EngineCore on the first image request",
        apply=apply_patches,
        roles=("api_server", "engine_core", "worker"),
        verified_on=("0.26.0", "0.32.0"),
        symbols=(NUM_PATCHES,),
        upstream=patches_rule,
    ),
    declare(
        "blip2_lora_int_tokens",
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
