"""Probe: which identifier each multimodal item reached the EngineCore with (vLLM PR 56432).

Wraps ``EngineCore.preprocess_add_request`` (EngineCore process; it turns an
``EngineCoreRequest`` into a scheduler ``Request``) and appends one JSON line per
request with multimodal items to ``<run>/events/mm_uuid.jsonl``:
``{"request_id", "items": [{"index", "modality", "identifier", "mm_hash", "offset",
"length"}]}``. ``identifier`` is what the encoder cache and the EC connector key on.

Inert unless requested: ``OPSCTL_PROBES`` (comma-separated) must contain ``mm_uuid``;
otherwise the ledger shows "skipped" with the reason.

Test-only knob, to prove that ``opsctl diag mm-uuid`` can fail:
``OPSCTL_MM_UUID_REWRITE=<uuid>`` (read through :mod:`engine_patches.knobs`, so honoured
only with ``OPSCTL_TEST_KNOBS=1``) makes the probe rewrite every item whose identifier
equals ``<uuid>`` to ``<uuid>~rewritten`` *before* the request is forwarded and
recorded, i.e. it simulates an engine that drops an explicit UUID.
"""

from __future__ import annotations

import functools

from engine_patches import knobs, wrapping
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe, symbols
from engine_patches.records import record_event
from engine_patches.wrapping import ALREADY, Originals

ORIGINALS = Originals()
MARK = "_opsctl_mm_uuid"
PROBE = "mm_uuid"
REWRITE_ENV = knobs.MM_UUID_REWRITE
REWRITE_SUFFIX = "~rewritten"


def requested() -> bool:
    """Whether ``OPSCTL_PROBES`` names this probe (or ``all``)."""
    return wrapping.requested(PROBE, every=True)


def rewrite(features: list, target: str) -> int:
    """Rewrite the identifier (and mm_hash) of items equal to ``target``; returns how many."""
    n = 0
    for f in features or ():
        if getattr(f, "identifier", None) == target:
            f.identifier = target + REWRITE_SUFFIX
            if getattr(f, "mm_hash", None) == target:
                f.mm_hash = target + REWRITE_SUFFIX
            n += 1
    return n


def describe(request_id: str, features: list) -> dict:
    """The ``mm_uuid`` event of one request.

    Each multimodal item's identifiers and placeholder position."""
    items = []
    for i, f in enumerate(features or ()):
        pos = getattr(f, "mm_position", None)
        items.append(
            {
                "index": i,
                "modality": getattr(f, "modality", None),
                "identifier": getattr(f, "identifier", None),
                "mm_hash": getattr(f, "mm_hash", None),
                "offset": getattr(pos, "offset", None),
                "length": getattr(pos, "length", None),
                "has_data": getattr(f, "data", None) is not None,
            }
        )
    return {"request_id": request_id, "items": items}


def wrap(original):
    """The probing ``EngineCore.preprocess_add_request``.

    ``EngineCore.preprocess_add_request`` that records (and, with the knob, rewrites)
    the identifiers of the request's multimodal items."""

    @functools.wraps(original)
    def preprocess_add_request(self, request, *args, **kwargs):
        rewritten = 0
        try:
            target = knobs.get(REWRITE_ENV)
            if target and request.mm_features:
                rewritten = rewrite(request.mm_features, target)
        except Exception:
            pass
        result = original(self, request, *args, **kwargs)
        try:
            req = result[0] if isinstance(result, tuple) else result
            features = getattr(req, "mm_features", None) or request.mm_features
            if features:
                payload = describe(str(request.request_id), features)
                if rewritten:
                    payload["test_rewrites"] = rewritten
                record_event(PROBE, payload)
        except Exception as exc:  # a probe never breaks the engine
            record_event(
                PROBE, {"request_id": str(getattr(request, "request_id", "?")), "error": repr(exc)}
            )
        return result

    return preprocess_add_request


def apply() -> Outcome:
    """Wrap ``EngineCore.preprocess_add_request`` when the probe is requested."""
    if not requested():
        return Outcome(SKIPPED, "not requested (set OPSCTL_PROBES=mm_uuid)")
    from vllm.v1.engine.core import EngineCore

    if not ORIGINALS.wrap(EngineCore, "preprocess_add_request", wrap, MARK):
        return ALREADY
    knob = knobs.get(REWRITE_ENV)
    detail = "records the identifier of every multimodal item at EngineCore.preprocess_add_request"
    if knob:
        detail += f"; TEST KNOB: rewrites identifier {knob!r}"
    return Outcome(APPLIED, detail)


def undo() -> None:
    """Restore ``EngineCore.preprocess_add_request`` (tests)."""
    ORIGINALS.restore()


PATCH = probe(
    "mm_uuid_probe",
    reason="opsctl probe for vLLM PR 56432: show which multimodal identifier reached "
    "the engine core",
    apply=apply,
    roles=("engine_core",),
    symbols=symbols("vllm.v1.engine.core", "EngineCore.preprocess_add_request"),
)
