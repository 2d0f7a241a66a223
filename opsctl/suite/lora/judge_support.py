"""`opsctl diag lora`, support per part: what the engine wrapped and what was measured.

What the engine's LoRA manager wrapped comes from the ``lora`` probe's records, for the language
model, the vision tower and the connector; also the engine's LoRA record as the report shows it.
Pure: no I/O, no UI.

A part is ``applied`` only when a measurement shows it (an adapter of that part, and for
the tower/connector of no language-model module, changed the output); ``supported`` when
the engine wrapped modules there but nothing measured that part alone; otherwise
``unsupported`` / ``not enabled`` / ``unknown``, each with the reason. Never a pass by
default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.records import record
from opsctl.suite.invariance.judge_engine import compilation_mode_name
from opsctl.suite.lora.judge import (
    APPLIED,
    LANGUAGE,
    NOT_ENABLED,
    PARTS,
    PASS,
    SUPPORTED,
    UNKNOWN,
    UNSUPPORTED,
    SingleResult,
)


@dataclass(frozen=True, slots=True)
class PartSupport:
    """One part's LoRA support (language, tower, connector), the modules wrapped, and why."""

    part: str  # language | tower | connector
    status: str  # applied | supported | unsupported | not enabled | unknown
    wrapped: int | None  # modules the engine wrapped with LoRA (None: no probe)
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """The part's support as the report holds it (``wrapped`` as ``wrapped_modules``)."""
        return record(self, {"wrapped": "wrapped_modules"})


def _carried(adapters: Sequence[Mapping[str, Any]], part: str) -> tuple[int, int]:
    """(modules of ``part`` the loaded adapters carry, how many of them the engine applied)."""
    carried = applied = 0
    for a in adapters:
        p = (a.get("parts") or {}).get(part) or {}
        carried += int(p.get("modules") or 0)
        applied += int(p.get("applied") or 0)
    return carried, applied


def _measured(part: str, parts_of: Mapping[str, Sequence[str]], single: Sequence[SingleResult]):
    """An adapter that targets ``part`` (and not the language model, for the tower and
    connector) and changed the output, if any: that part's LoRA was applied."""
    for s in single:
        parts = set(parts_of.get(s.adapter) or ())
        if part in parts and s.verdict == PASS and (part == LANGUAGE or LANGUAGE not in parts):
            return s.adapter
    return None


def _engine_part(
    part: str, manager: Mapping[str, Any], adapters: Sequence[Mapping[str, Any]]
) -> PartSupport | None:
    """What the engine's own record says about ``part`` (None: nothing against it)."""
    wrapped = len((manager.get("wrapped") or {}).get(part) or [])
    carried, applied = _carried(adapters, part)
    if part != LANGUAGE and not manager.get("enable_tower_connector_lora"):
        why = "engine started without --enable-tower-connector-lora"
        return PartSupport(part, NOT_ENABLED, wrapped, why)
    if part != LANGUAGE and not manager.get("tower_connector_lora"):
        why = "the engine turned tower/connector LoRA off for this model (not supported)"
        return PartSupport(part, UNSUPPORTED, wrapped, why)
    if wrapped == 0:
        why = f"the engine wrapped no {part} module with LoRA (no LoRA-capable layer)"
        if carried:
            why += f"; {carried} adapter module(s) for it are unused"
        return PartSupport(part, UNSUPPORTED, 0, why)
    if carried > applied:
        why = f"{carried - applied} of {carried} adapter module(s) for it were not wrapped (unused)"
        return PartSupport(part, UNSUPPORTED, wrapped, why)
    return None


def support(
    multimodal: bool,
    manager: Mapping[str, Any] | None,
    adapters: Sequence[Mapping[str, Any]],
    parts_of: Mapping[str, Sequence[str]],
    single: Sequence[SingleResult],
) -> list[PartSupport]:
    """Per part (language, tower, connector): applied, supported, unsupported, not enabled, unknown.

    Per part: ``applied`` only when a measurement shows it (an adapter of that part
    changed the output), ``supported`` when the engine wrapped modules but nothing
    measured that part alone, else unsupported / not enabled / unknown, with the why.
    ``manager``/``adapters``: the lora probe's records (None/empty without the probe);
    ``parts_of``: adapter -> the parts it targets, where known.
    """
    out = []
    for part in PARTS if multimodal else (LANGUAGE,):
        engine = _engine_part(part, manager, adapters) if manager is not None else None
        if engine is not None:
            out.append(engine)
            continue
        wrapped = None if manager is None else len((manager.get("wrapped") or {}).get(part) or [])
        by = _measured(part, parts_of, single)
        if by is not None:
            alone = "" if part == LANGUAGE else " with no language-model module"
            out.append(PartSupport(part, APPLIED, wrapped, f"adapter {by}{alone} changed outputs"))
        elif wrapped:
            why = f"{wrapped} module(s) wrapped; no adapter measured this part on its own"
            out.append(PartSupport(part, SUPPORTED, wrapped, why))
        else:
            why = "no lora probe record and no adapter that measures this part alone"
            out.append(PartSupport(part, UNKNOWN, wrapped, why))
    return out


def engine_summary(
    manager: Mapping[str, Any] | None,
    info: Mapping[str, Any] | None,
    adapters: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """The engine's own LoRA and execution record for the report (None: no probes)."""
    if manager is None and info is None:
        return None
    mgr, inf = manager or {}, info or {}
    mode = mgr.get("compilation_mode") or inf.get("compilation_mode")
    return {
        "enforce_eager": inf.get("enforce_eager"),
        "compilation_mode": compilation_mode_name(mode) if mode is not None else None,
        "punica_wrapper": mgr.get("punica_wrapper"),
        "enable_tower_connector_lora": mgr.get("enable_tower_connector_lora"),
        "tower_connector_lora": mgr.get("tower_connector_lora"),
        "max_loras": mgr.get("max_loras"),
        "max_lora_rank": mgr.get("max_lora_rank"),
        "wrapped_modules": {k: len(v) for k, v in (mgr.get("wrapped") or {}).items()},
        "adapters": [dict(a) for a in adapters],
    }
