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
import os
from typing import Any

from engine_patches import knobs
from engine_patches.patch import symbols
from engine_patches.registry import APPLIED, SKIPPED, Outcome, Patch, record_event

ORIGINALS: dict[str, Any] = {}
PROBE = "mm_uuid"
REWRITE_ENV = knobs.MM_UUID_REWRITE
REWRITE_SUFFIX = "~rewritten"


def requested() -> bool:
    raw = os.environ.get("OPSCTL_PROBES", "")
    names = {p.strip() for p in raw.split(",") if p.strip()}
    return PROBE in names or "all" in names


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

    preprocess_add_request._opsctl_mm_uuid = True  # type: ignore[attr-defined]
    return preprocess_add_request


def apply() -> Outcome:
    if not requested():
        return Outcome(SKIPPED, "not requested (set OPSCTL_PROBES=mm_uuid)")
    from vllm.v1.engine.core import EngineCore

    current = EngineCore.preprocess_add_request
    if getattr(current, "_opsctl_mm_uuid", False):
        return Outcome(APPLIED, "already applied in this process")
    ORIGINALS["preprocess_add_request"] = current
    EngineCore.preprocess_add_request = wrap(current)  # type: ignore[method-assign]
    knob = knobs.get(REWRITE_ENV)
    detail = "records the identifier of every multimodal item at EngineCore.preprocess_add_request"
    if knob:
        detail += f"; TEST KNOB: rewrites identifier {knob!r}"
    return Outcome(APPLIED, detail)


def undo() -> None:
    from vllm.v1.engine.core import EngineCore

    if "preprocess_add_request" in ORIGINALS:
        EngineCore.preprocess_add_request = ORIGINALS.pop("preprocess_add_request")  # type: ignore[method-assign]


PATCH = Patch(
    name="mm_uuid_probe",
    target="vllm.v1.engine.core.EngineCore.preprocess_add_request",
    versions="any",
    reason="opsctl probe for vLLM PR 56432: show which multimodal identifier reached the engine core",
    apply=apply,
    roles=("engine_core",),
    verified_on=("0.32.0",),
    symbols=symbols("vllm.v1.engine.core", "EngineCore.preprocess_add_request"),
    kind="probe",
)
