"""Whether a check can trust the engine probes it relies on, from the engine's patch ledger.

A check that reads a probe's events (invariance: ``batch``; with images also
``mm_uuid``; diag lora: ``lora``; mm-uuid: ``mm_uuid``) says so in its report when the
ledger shows that probe

- could not hook on this vLLM (every engine process that runs it recorded ``skipped``
  for a reason other than "not asked for", or ``failed``): finding
  ``<check>.probe_unhooked``, severity fail -- the check saw nothing from it, so it
  must not pass on that evidence (fail-closed);
- hooked but is unverified on this vLLM release (``verified: false``, ``note``
  "unverified on 0.26.0"): finding ``<check>.probe_unverified``, severity warning --
  its evidence is unverified.

A probe that was not asked for (``inert``, or disabled by ``OPSCTL_DISABLE_PATCHES``)
or a server without a ledger gives no finding: the check's own rules for missing
evidence apply. Pure: ledger records (``ledger/<pid>.json`` as read) in, findings out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, WARNING, Finding

PATCH_OF = {
    "batch": "batch_probe",
    "lora": "lora_swap_probe",
    "mm_uuid": "mm_uuid_probe",
    "gate": "batch_gate",
}
NOT_ASKED = ("inert", "disabled by")
NOT_HERE = "not needed in the"
HOOKED = ("applied", "already upstream")


@dataclass(frozen=True, slots=True)
class ProbeState:
    """What the ledger says of one probe across the engine's processes."""

    probe: str
    asked: bool  # some process was asked to run it
    hooked: bool  # some process hooked it (status applied)
    unverified_on: str | None  # the release it is unverified on, when hooked there
    why_not: tuple[str, ...] = ()  # details of the processes that could not hook it


def _entries(
    records: Sequence[Mapping[str, Any]], patch: str
) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    return [
        (rec, p)
        for rec in records
        for p in rec.get("patches") or ()
        if isinstance(p, Mapping) and p.get("name") == patch
    ]


def probe_state(records: Sequence[Mapping[str, Any]], probe: str) -> ProbeState | None:
    """The probe's state in these ledger records; None when no process recorded it."""
    patch = PATCH_OF.get(probe, probe)
    rows = [
        (rec, p)
        for rec, p in _entries(records, patch)
        if not str(p.get("detail") or "").startswith(NOT_HERE)
    ]
    if not rows:
        return None
    asked = [
        (rec, p)
        for rec, p in rows
        if not (p.get("status") == "skipped" and str(p.get("detail") or "").startswith(NOT_ASKED))
    ]
    hooked = [(rec, p) for rec, p in asked if p.get("status") in HOOKED]
    unverified = next(
        (
            str(p.get("note") or "").removeprefix("unverified on ").strip()
            or str(rec.get("vllm_version") or "this vLLM")
            for rec, p in hooked
            if p.get("verified") is False
        ),
        None,
    )
    why = tuple(
        dict.fromkeys(
            f"{rec.get('role', '?')}: {p.get('status')}: {str(p.get('detail') or '')[:300]}"
            for rec, p in asked
            if p.get("status") not in HOOKED
        )
    )
    return ProbeState(probe, bool(asked), bool(hooked), unverified, why)


def probe_findings(
    records: Sequence[Mapping[str, Any]], probes: Iterable[str], check: str
) -> list[Finding]:
    """Findings on the probes ``check`` relies on: unhooked (fail) or unverified (warning).

    ``<check>.probe_unhooked`` (fail) / ``<check>.probe_unverified`` (warning) for the
    probes ``check`` relies on; [] when the ledger shows nothing wrong (or is absent).
    """
    out: list[Finding] = []
    for probe in probes:
        state = probe_state(records, probe)
        if state is None or not state.asked:
            continue
        patch = PATCH_OF.get(probe, probe)
        if not state.hooked:
            out.append(
                Finding(
                    FAIL,
                    f"{check}.probe_unhooked",
                    f"the {probe} probe could not hook on this vLLM, so the evidence this "
                    f"check needs from it was not seen ({'; '.join(state.why_not)})",
                    {"probe": probe, "patch": patch, "why": list(state.why_not)},
                )
            )
        elif state.unverified_on is not None:
            out.append(
                Finding(
                    WARNING,
                    f"{check}.probe_unverified",
                    f"the {probe} probe is unverified on vLLM {state.unverified_on}: "
                    "the evidence this check takes from it is unverified",
                    {"probe": probe, "patch": patch, "vllm_version": state.unverified_on},
                )
            )
    return out


def lines(findings: Sequence[Finding], severity: str) -> list[str]:
    """The findings of one severity as report lines (``code: message``).

    For checks whose reports carry reasons and warnings as text.
    """
    return [f"{f.code}: {f.message}" for f in findings if f.severity == severity]
