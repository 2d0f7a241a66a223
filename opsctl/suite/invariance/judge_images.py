"""Batch invariance with images (pure): which images each prompt carries, and their arrival.

vLLM PR 56528's vision-language case: whether the images really reached the engine. Pure: no I/O, no
UI.

- :func:`plan`: deterministic images per prompt: prompt ``i`` carries ``1 + i % m``
  images (``m``: the most one prompt may carry; 1 for a one-image model), each image a
  different colour (:func:`colour`), so no two prompts share an image and prompts with
  one and with several images sit in one batch.
- :func:`images_for` / :func:`model_limit`: how many images per prompt a run sends
  (the model's limit, or the caller's, 0 for a text-only model), refused when a
  text-only model is asked for images.
- :func:`evidence`: what the engine's records say about every request's images:
  the items the engine core received (``mm_uuid`` probe, with the identifiers: the
  ``uuid`` each image was sent with) and the items the vision encoder ran (``encoder``
  records of the ``batch`` probe), or, without those probes, the image tokens the
  server counted (``usage.prompt_tokens`` minus the text-only ``/tokenize`` count).
- :func:`assess`: fail closed: a request whose images did not all arrive (or that
  nothing shows arrived) fails the run; images never encoded together in the BS=N
  phase is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsctl.errors import BadInput
from opsctl.suite.invariance.judge_engine import prompt_index

RGB = tuple[int, int, int]
SIDES = ("BS=1", "BS=N")
ENDPOINT = "/v1/chat/completions"
DEFAULT_LIMIT = 999  # vLLM's per-modality count when no --limit-mm-per-prompt was given
PROBES_SOURCE = "engine probes (mm_uuid: items received; batch: items encoded)"
USAGE_SOURCE = "usage.prompt_tokens minus the text-only /tokenize count"
TEXT_ONLY = "text only: no images sent"


def colour(k: int) -> RGB:
    """The ``k``-th image's colour, distinct for k < 256.

    Each channel is a bijection of k modulo 256.
    """
    return ((37 * k + 11) % 256, (91 * k + 53) % 256, (173 * k + 101) % 256)


def counts(prompts: int, max_images: int) -> tuple[int, ...]:
    """Images per prompt: 1, 2, ..., max_images, 1, 2, ... (all 0 for text only)."""
    if max_images <= 0:
        return (0,) * prompts
    return tuple(1 + i % max_images for i in range(prompts))


def plan(prompts: int, max_images: int) -> tuple[tuple[RGB, ...], ...]:
    """Each prompt's images (colours), none shared between prompts."""
    out: list[tuple[RGB, ...]] = []
    k = 0
    for n in counts(prompts, max_images):
        out.append(tuple(colour(k + j) for j in range(n)))
        k += n
    return tuple(out)


def images_for(multimodal: bool, model_limit: int, requested: int | None, model: str) -> int:
    """Images per prompt for a run: ``--images``, else the model's limit, else 0.

    Images per prompt for a run: ``requested`` (``--images``) when given, else the
    model's limit on a multimodal model, else 0. Images for a text-only model are bad
    input (they would be refused, or worse, ignored).
    """
    if requested is None:
        return max(1, model_limit) if multimodal else 0
    if requested > 0 and not multimodal:
        raise BadInput(
            f"{model} is not a vision-language model: it cannot take --images {requested}"
        )
    return requested


def model_limit(catalog_limit: int | None, engine_limit: object) -> int:
    """Most images one prompt may carry: the catalog's, the engine's, else 1.

    Most images one prompt may carry: opsctl's catalog value for an embedded model
    (capped by the engine's ``--limit-mm-per-prompt`` when it recorded one), else the
    engine's limit, else 1 (what every vision-language model takes).
    """
    engine = engine_limit if isinstance(engine_limit, int) and engine_limit >= 1 else None
    if catalog_limit:
        return min(catalog_limit, engine) if engine else catalog_limit
    return engine if engine and engine < DEFAULT_LIMIT else 1


def image_uuid(request_id: str, index: int) -> str:
    """The ``uuid`` image ``index`` of a request is sent with, unique per request.

    So no request reuses another's processed image or encoder output.
    """
    return f"{request_id}-img{index}"


# ---- what the engine shows ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageEvidence:
    """What shows that each request's images arrived: per prompt sent, received, encoded."""

    source: str  # PROBES_SOURCE | USAGE_SOURCE | TEXT_ONLY | "none"
    sent: tuple[int, ...]  # images per prompt
    received: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    encoded: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    image_tokens: Mapping[str, tuple[int | None, ...]] = field(default_factory=dict)
    identifiers_matched: int | None = None  # items that arrived with the uuid sent
    encoder_max_batch: int | None = None  # BS=N prompts whose images ran the encoder at once

    @property
    def total(self) -> int:
        """Images sent over all prompts."""
        return sum(self.sent)

    def missing(self) -> list[str]:
        """One line per request whose images the records do not all show."""
        out = []
        for side in SIDES:
            for i, n in enumerate(self.sent):
                why = _short(side, i, n, self) if n else None
                if why:
                    out.append(f"{side} prompt {i}: {why}")
        return out

    @property
    def reached(self) -> bool | None:
        """Every request's images shown arriving; None when no image was sent."""
        if self.total == 0:
            return None
        return self.source != "none" and not self.missing()

    def to_dict(self) -> dict[str, Any]:
        """The evidence as the report's ``images`` object holds it."""
        return {
            "endpoint": ENDPOINT,
            "source": self.source,
            "per_prompt": list(self.sent),
            "total": self.total,
            "reached": self.reached,
            "received": {k: list(v) for k, v in self.received.items()},
            "encoded": {k: list(v) for k, v in self.encoded.items()},
            "image_tokens": {k: list(v) for k, v in self.image_tokens.items()},
            "identifiers_matched": self.identifiers_matched,
            "encoder_max_batch": self.encoder_max_batch,
            "missing": self.missing(),
        }


def _at(values: Mapping[str, tuple[int | None, ...]], side: str, i: int) -> int | None:
    row = values.get(side) or ()
    return row[i] if i < len(row) else None


def _short(side: str, i: int, n: int, ev: ImageEvidence) -> str | None:
    """Why request (side, i) lacks evidence that its ``n`` images arrived, or None."""
    if ev.source == "none":
        return f"nothing shows that its {n} image(s) reached the engine"
    if ev.source == USAGE_SOURCE:
        got = _at(ev.image_tokens, side, i)
        if got is None:
            return "no prompt_tokens / text-only count to compare"
        return None if got >= n else f"{got} image token(s) counted for {n} image(s)"
    got = _at(ev.received, side, i)
    if got is None:
        return f"no engine record of its request ({n} image(s) sent)"
    if got < n:
        return f"engine core received {got} of {n} image(s)"
    enc = _at(ev.encoded, side, i)
    if ev.encoded and (enc or 0) < n:
        return f"vision encoder ran {enc or 0} of {n} image(s)"
    return None


def _per_prompt(by_prompt: Mapping[int, int], prompts: int) -> tuple[int | None, ...]:
    return tuple(by_prompt.get(i) for i in range(prompts))


def received_items(
    mm_events: Sequence[Mapping[str, Any]], tag: str, prompts: int
) -> tuple[tuple[int | None, ...], int]:
    """Items the engine core received per prompt, and how many kept their uuid.

    From ``mm_uuid`` probe records: items the engine core received per prompt of the
    phase tagged ``tag`` (None: no record), and how many arrived with the uuid sent.
    """
    got: dict[int, int] = {}
    matched = 0
    for e in mm_events:
        i = prompt_index(str(e.get("request_id", "")), tag)
        if i is None or i >= prompts or "error" in e:
            continue
        items = [x for x in e.get("items") or [] if isinstance(x, Mapping)]
        got[i] = got.get(i, 0) + len(items)
        for j, x in enumerate(items):
            ident = str(x.get("identifier") or "")
            if prompt_index(ident, tag) == i and ident.endswith(f"-img{j}"):
                matched += 1
    return _per_prompt(got, prompts), matched


def encoded_items(
    batch_events: Sequence[Mapping[str, Any]], tag: str, prompts: int
) -> tuple[tuple[int | None, ...], int | None]:
    """Items the vision encoder ran per prompt, and the most prompts encoded in one call.

    From the batch probe's ``encoder`` records: items the vision encoder ran per
    prompt of the phase tagged ``tag``, and the most of those prompts encoded in one
    call (None, None: no encoder record at all, e.g. an older probe).
    """
    calls = [e for e in batch_events if e.get("event") == "encoder"]
    if not calls:
        return (), None
    got: dict[int, int] = {}
    together = 0
    for e in calls:
        ours: set[int] = set()
        for rid, n in (e.get("items") or {}).items():
            i = prompt_index(str(rid), tag)
            if i is not None and i < prompts:
                got[i] = got.get(i, 0) + int(n)
                ours.add(i)
        together = max(together, len(ours))
    return tuple(got.get(i, 0) for i in range(prompts)), together


def evidence(
    sent: Sequence[int],
    tags: tuple[str, str],
    *,
    mm_events: Sequence[Mapping[str, Any]] | None,
    batch_events: Sequence[Mapping[str, Any]],
    image_tokens: Mapping[str, Sequence[int | None]] | None = None,
) -> ImageEvidence:
    """What shows that each request's images arrived.

    ``mm_events``: the mm_uuid probe's records (None: probe not active there); ``image_tokens``
    per side and prompt: the usage fallback (None when not measured).
    """
    n = len(sent)
    if not any(sent):
        return ImageEvidence(TEXT_ONLY, tuple(sent))
    if mm_events is not None:
        received, encoded, matched, batch = {}, {}, 0, None
        for side, tag in zip(SIDES, tags, strict=True):
            received[side], m = received_items(mm_events, tag, n)
            matched += m
            enc, together = encoded_items(batch_events, tag, n)
            if enc:
                encoded[side] = enc
                if side == "BS=N":
                    batch = together
        return ImageEvidence(PROBES_SOURCE, tuple(sent), received, encoded, {}, matched, batch)
    if image_tokens is not None:
        tokens = {side: tuple(image_tokens.get(side) or ()) for side in SIDES}
        return ImageEvidence(USAGE_SOURCE, tuple(sent), image_tokens=tokens)
    return ImageEvidence("none", tuple(sent))


def assess(ev: ImageEvidence, batch_size: int) -> tuple[list[str], list[str]]:
    """(failures, warnings) of a run with images.

    Fail closed when the records do not show every request's images arriving; warn when the BS=N
    phase never ran two prompts' images through the encoder together (tokens may still batch).
    """
    if ev.total == 0:
        return [], []
    failures = [f"images did not reach the engine: {m}" for m in ev.missing()]
    warnings: list[str] = []
    if ev.source == USAGE_SOURCE:
        warnings.append(
            "images checked by token counts only (no mm_uuid/batch probe on this engine)"
        )
    if ev.encoder_max_batch is not None and ev.encoder_max_batch < 2 and batch_size > 1:
        warnings.append(
            f"no two BS={batch_size} prompts had their images encoded in one encoder call "
            "(they still shared sampling steps: see the batch)"
        )
    return failures, warnings
