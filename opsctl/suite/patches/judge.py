"""patches, pure: the engine-patch ledger's records into a summary and findings.

The records are the ledger the engine plugin writes, one per process (read by
opsctl.checks.patches); a failed patch or an active test knob fails the check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opsctl.domain.findings import FAIL, OK, Finding

FAILED_PATCH = "failed"


def ledger_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The patch ledger in a few fields: processes, vLLM version, platform, patch statuses.

    Processes as (pid, role); statuses per patch across processes (name -> status ->
    count), with the names of those that failed somewhere and the test knobs set.
    """
    patches: dict[str, dict[str, int]] = {}
    knobs: dict[str, str] = {}
    for r in records:
        for p in r.get("patches") or ():
            by_status = patches.setdefault(str(p.get("name")), {})
            status = str(p.get("status"))
            by_status[status] = by_status.get(status, 0) + 1
        if isinstance(r.get("test_knobs"), Mapping):
            knobs.update({str(k): str(v) for k, v in r["test_knobs"].items()})
    newest = records[-1] if records else {}
    return {
        "processes": [{"pid": r.get("pid"), "role": r.get("role")} for r in records],
        "vllm_version": newest.get("vllm_version"),
        "platform": _platform(records),
        "patches": patches,
        "failed": sorted(n for n, s in patches.items() if FAILED_PATCH in s),
        "test_knobs": knobs,
    }


def _platform(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The platform the engine processes reported (ledger field "platform"), workers first."""
    for r in sorted(records, key=lambda r: r.get("role") == "api_server"):
        if r.get("platform"):
            return str(r["platform"])
    return None


def ledger_findings(records: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Findings of the patch-ledger check: no ledger, failed patches, test knobs, or sane."""
    if not records:
        return [Finding(FAIL, "patches.no_ledger", "the run directory has no patch ledger")]
    out: list[Finding] = []
    for r in records:
        for p in r.get("patches") or ():
            if p.get("status") == FAILED_PATCH:
                detail = str(p.get("detail") or "").splitlines()
                out.append(
                    Finding(
                        FAIL,
                        "patches.failed",
                        f"patch {p.get('name')} failed in pid {r.get('pid')} ({r.get('role')})"
                        + (f": {detail[0]}" if detail else ""),
                        {"patch": p.get("name"), "pid": r.get("pid"), "role": r.get("role")},
                    )
                )
    summary = ledger_summary(records)
    if summary["test_knobs"]:
        named = ", ".join(f"{k}={v}" for k, v in sorted(summary["test_knobs"].items()))
        out.append(
            Finding(
                FAIL,
                "patches.test_knobs",
                f"test knobs active in the engine ({named}): its behaviour is altered on purpose",
                {"test_knobs": summary["test_knobs"]},
            )
        )
    if not out:
        out.append(
            Finding(
                OK,
                "patches.sane",
                f"{len(records)} process(es) recorded; no failed patch, no test knob",
            )
        )
    return out
