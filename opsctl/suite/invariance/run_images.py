"""The image side of `diag invariance`: the images a vision-language model run sends.

`diag invariance` on a vision-language model: the image side of
:mod:`opsctl.suite.invariance.run` (vLLM PR 56528's multimodal case).

- :func:`spec_images` / :func:`with_limit`: how many images per prompt a run on an
  engine spec sends, and the ``--limit-mm-per-prompt`` the engine then needs;
- :func:`pictures`: each prompt's images on a live server, decided from the engine's
  own record (engine_info: ``multimodal``, ``limit_mm_per_prompt``), else opsctl's
  catalog, else the archetype of the engine opsctl started;
- :func:`senders`: the BS=1 and BS=N calls (completions for text, chat with images);
- :func:`evidence`: what shows every request's images reached the engine (the probes'
  records, else the usage cross-check).

Decisions are :mod:`opsctl.suite.invariance.judge_images`; HTTP is
:mod:`opsctl.suite.invariance.collect_images` and :mod:`opsctl.collectors.completions`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from opsctl.checks.target import EngineSpec, Live
from opsctl.collectors import completions as cc
from opsctl.collectors import engine_records
from opsctl.collectors.engine_records import EngineRecords
from opsctl.errors import BadInput
from opsctl.suite.invariance import collect_images as mmc
from opsctl.suite.invariance import judge_images as img

PROBES = frozenset({"batch", "gate", "mm_uuid"})  # with images: what the engine core received
LIMIT_ARG = "--limit-mm-per-prompt"
LIST_REFUSAL = (
    "--batch-via list sends the N prompts in one /v1/completions request, which carries "
    "no images; prompts with images go as N concurrent chat requests (--batch-via requests)"
)
Pictures = tuple[tuple[img.RGB, ...], ...]
Phase = Callable[[str, Callable[[int, cc.Timed], None]], list[cc.Timed]]


def catalog_entry(model: str | None) -> tuple[str | None, int | None]:
    """(archetype, images per prompt) of an embedded model's name; (None, None) else."""
    from opsctl.embedded import catalog

    spec = catalog.CATALOG.get(model or "")
    return (spec.archetype, spec.images_per_prompt) if spec is not None else (None, None)


def spec_images(spec: EngineSpec, requested: int | None, default_model: str) -> int:
    """Most images per prompt a run on ``spec``'s model sends (0: a text-only model).

    ``requested`` when given, else the catalog's value (1 for a model directory).
    BadInput for images on a text-only model."""
    from opsctl.engine.model import resolve

    resolved = resolve(spec.model or default_model)
    _, per_prompt = catalog_entry(resolved.name) if resolved.embedded else (None, None)
    multimodal = resolved.archetype == "vision-language"
    return img.images_for(multimodal, per_prompt or 1, requested, resolved.name)


def with_limit(args: tuple[str, ...], images: int) -> tuple[str, ...]:
    """``args`` plus the image limit several images per prompt need (unless given)."""
    if images > 1 and LIMIT_ARG not in args:
        return (*args, LIMIT_ARG, json.dumps({"image": images}))
    return args


def pictures(live: Live, model: str, requested: int | None, prompts: int) -> Pictures:
    """Each prompt's images on this server (all empty for a text-only model)."""
    info = engine_records.read(live.run_dir).info or {}
    archetype, per_prompt = catalog_entry(live.model or model)
    multimodal = info.get("multimodal")
    if not isinstance(multimodal, bool):
        multimodal = "vision-language" in (archetype, live.archetype)
    limits = info.get("limit_mm_per_prompt")
    limit = img.model_limit(per_prompt, limits.get("image") if isinstance(limits, dict) else None)
    return img.plan(prompts, img.images_for(multimodal, limit, requested, model))


def senders(
    live: Live,
    params: cc.CompletionParams,
    prompts: Sequence[str],
    n: int,
    batch_via: str | None,
    pics: Pictures,
) -> tuple[Phase, Phase, str]:
    """The BS=1 call, the BS=N call and how BS=N is sent (``list`` or ``requests``).

    /v1/completions for text (``list``: one request with N prompts by default),
    /v1/chat/completions with images (N requests at once; ``list`` is refused: it cannot
    carry images)."""
    url, key, texts = live.url, live.api_key, list(prompts)
    if not any(pics):
        via = batch_via or "list"
        together = cc.run_together_list if via == "list" else cc.run_together
        return (
            lambda tag, done: cc.run_alone(url, params, texts, tag, done, api_key=key),
            lambda tag, done: together(url, params, texts, tag, n, done, api_key=key),
            via,
        )
    if batch_via == "list":
        raise BadInput(LIST_REFUSAL)
    return (
        lambda tag, done: mmc.run_alone(url, params, texts, pics, tag, done, api_key=key),
        lambda tag, done: mmc.run_together(url, params, texts, pics, tag, n, done, api_key=key),
        "requests",
    )


def evidence(
    pics: Pictures,
    tags: tuple[str, str],
    records: EngineRecords,
    sides: tuple[list[cc.Timed], list[cc.Timed]],
    text_tokens: list[int | None] | None,
) -> img.ImageEvidence:
    """What shows each request's images reached the engine.

    Its probes' records, else the usage cross-check (prompt tokens minus the text-only count
    per request)."""
    tokens = None
    if text_tokens is not None:
        tokens = {
            side: [
                None
                if t.generated.prompt_tokens is None or base is None
                else t.generated.prompt_tokens - base
                for t, base in zip(timed, text_tokens, strict=True)
            ]
            for side, timed in zip(img.SIDES, sides, strict=True)
        }
    return img.evidence(
        [len(p) for p in pics],
        tags,
        mm_events=records.mm_items,
        batch_events=records.batch,
        image_tokens=tokens,
    )
