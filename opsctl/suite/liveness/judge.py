"""Pure rules of the checks certify adds: liveness, patch ledger, Engram and shutdown.

Inputs are what the collectors read (plain values); outputs are findings and a verdict. The checks
themselves: opsctl.checks.liveness, opsctl.checks.hygiene.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding

GEN_COUNTER = "vllm:generation_tokens_total"
PROMPT_COUNTER = "vllm:prompt_tokens_total"
FAILED_PATCH = "failed"


def verdict_of(findings: Sequence[Finding]) -> str:
    """fail on any failure; unverified when something could not be measured; else pass."""
    if any(f.severity == FAIL for f in findings):
        return "fail"
    if any(f.code.endswith(".unverified") for f in findings):
        return "unverified"
    return "pass"


# ---- liveness --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Liveness:
    """What the liveness check measured on one server."""

    health_status: int | None
    health_error: str | None
    endpoint: str  # /v1/completions, /score, /v1/embeddings
    request_status: int | None
    request_error: str | None
    tokens: int | None  # generated (or prompt, for pooling) tokens the answer reports
    counter: str  # the /metrics counter that must advance
    before: float | None  # None: /metrics unreadable
    after: float | None
    waited: float  # seconds waited for the counter to advance


def liveness_findings(m: Liveness) -> list[Finding]:
    """Findings of the liveness check: /health, one request, and the engine's progress."""
    out: list[Finding] = []
    if m.health_status != 200:
        got = f"HTTP {m.health_status}" if m.health_status is not None else m.health_error
        out.append(Finding(FAIL, "liveness.health", f"/health did not answer 200 ({got})"))
    if m.request_status != 200 or m.request_error:
        got = f"HTTP {m.request_status}" if m.request_status is not None else "no answer"
        why = f": {m.request_error}" if m.request_error else ""
        out.append(
            Finding(FAIL, "liveness.request", f"one {m.endpoint} request failed ({got}){why}")
        )
    if m.before is None or m.after is None:
        out.append(
            Finding(
                WARNING,
                "liveness.unverified",
                f"/metrics has no {m.counter}: forward progress could not be verified",
            )
        )
        return out
    delta = m.after - m.before
    if delta >= 1:
        out.append(
            Finding(
                OK,
                "liveness.progress",
                f"{m.counter} advanced by {delta:g} ({m.before:g} -> {m.after:g})",
                {"before": m.before, "after": m.after},
            )
        )
    elif m.request_status == 200:
        out.append(
            Finding(
                FAIL,
                "liveness.no_progress",
                f"{m.counter} did not advance within {m.waited:.0f} s of a successful "
                f"{m.endpoint} request ({m.before:g} -> {m.after:g}): the server answers but "
                "the engine shows no forward progress",
                {"before": m.before, "after": m.after},
            )
        )
    return out


# ---- patch ledger ----------------------------------------------------------------------------


def ledger_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The patch ledger in a few fields: processes, vLLM version, platform, patch statuses.

    The ledger in a few fields: processes (role, pid), vLLM version, platform, and
    per patch the statuses it got across processes (name -> status -> count).
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


# ---- Engram hygiene --------------------------------------------------------------------------


def server_tables(
    tables: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    pids: Sequence[int],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], list[str]]:
    """engram inspect's tables and findings narrowed to the server under check.

    ``pids``: the server's processes on this node (its API server and every descendant);
    empty when none is local, and then nothing is narrowed (every table of the node is
    judged). A table mapped only by other processes belongs to another server (one being
    filled reads "not constant" until its fill ends): it and its findings are left out and
    named (the third value). Tables nobody maps stay: orphans are the node's hygiene, judged
    for every certify."""
    if not pids:
        return list(tables), list(findings), []
    ours = set(pids)
    others = sorted(
        str(t["name"])
        for t in tables
        if t.get("mapper_pids") and not ours & set(t.get("mapper_pids") or ())
    )
    left_out = set(others)
    kept = [t for t in tables if t["name"] not in left_out]
    said = [f for f in findings if (f.get("details") or {}).get("table") not in left_out]
    return kept, said, others


def engram_findings(
    inspect: Sequence[Mapping[str, Any]],
    orphans: Sequence[Mapping[str, Any]],
    capacity: Mapping[str, Any] | None,
    others: Sequence[str] = (),
) -> list[Finding]:
    """Findings of the Engram hygiene check: inspect, orphans and /dev/shm capacity.

    ``inspect``: engram inspect's findings; ``orphans``: engram clean's dry-run list;
    ``capacity``: the plan's {"total_bytes", "shm_free_bytes", "fits_shm", "chosen"} for the
    model's Engram tables, None when the model has none; ``others``: tables of other
    servers on this node left out (:func:`server_tables`), said as info.
    """
    out = [
        Finding(str(f["severity"]), str(f["code"]), str(f["message"]), dict(f.get("details") or {}))
        for f in inspect
    ]
    if others:
        out.append(
            Finding(
                INFO,
                "engram.other_servers",
                f"{len(others)} table(s) mapped only by other processes of this node, not "
                f"judged for this server: {', '.join(others[:5])}",
                {"tables": list(others)},
            )
        )
    if orphans:
        size = sum(int(o.get("size_bytes") or 0) for o in orphans)
        names = ", ".join(str(o["name"]) for o in orphans[:5])
        out.append(
            Finding(
                FAIL,
                "engram.orphans",
                f"{len(orphans)} orphaned Engram table(s) in /dev/shm ({size} bytes): {names}",
                {"orphans": [o["name"] for o in orphans], "hint": "opsctl engram clean --yes"},
            )
        )
    else:
        out.append(Finding(OK, "engram.no_orphans", "no orphaned Engram table in /dev/shm"))
    if capacity is None:
        out.append(Finding(INFO, "engram.not_in_model", "the model has no Engram tables"))
    elif capacity.get("fits_shm") is False:
        out.append(
            Finding(
                WARNING,
                "engram.shm_capacity",
                f"the model's Engram tables ({capacity.get('total_bytes')} bytes) do not fit "
                f"in /dev/shm ({capacity.get('shm_free_bytes')} bytes free): vLLM falls back to "
                f"{capacity.get('chosen')}",
                dict(capacity),
            )
        )
    else:
        out.append(
            Finding(OK, "engram.shm_capacity_ok", "the model's Engram tables fit in /dev/shm")
        )
    return out


# ---- shutdown hygiene ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shutdown:
    """One engine after the session closed: its stop report and a fresh recheck."""

    index: int
    url: str
    stopped: bool  # it has a stop report
    seconds: float | None
    signals: tuple[str, ...]
    leftover_pids: tuple[int, ...]  # the stop report's
    alive_now: tuple[int, ...]  # the recheck's: its processes still running
    shm_removed: tuple[str, ...]
    shm_kept: tuple[str, ...]  # the stop report's: segments it could not remove
    shm_left_now: tuple[str, ...]  # the recheck's: its segments still in /dev/shm


def shutdown_findings(engines: Sequence[Shutdown]) -> list[Finding]:
    """Findings of the shutdown check: engines not stopped, processes or segments left."""
    if not engines:
        return [Finding(INFO, "shutdown.no_engine", "no engine was started")]
    out: list[Finding] = []
    for e in engines:
        where = f"engine {e.index} ({e.url})"
        pids = sorted(set(e.leftover_pids) | set(e.alive_now))
        segments = sorted(set(e.shm_kept) | set(e.shm_left_now))
        if not e.stopped:
            out.append(Finding(FAIL, "shutdown.not_stopped", f"{where} was never stopped"))
        if pids:
            out.append(
                Finding(
                    FAIL,
                    "shutdown.processes",
                    f"{where}: {len(pids)} process(es) left after stop: {pids}",
                    {"pids": pids},
                )
            )
        if segments:
            out.append(
                Finding(
                    FAIL,
                    "shutdown.segments",
                    f"{where}: {len(segments)} /dev/shm segment(s) left: {segments[:5]}",
                    {"segments": segments},
                )
            )
        if e.stopped and not pids and not segments:
            out.append(
                Finding(
                    OK,
                    "shutdown.clean",
                    f"{where}: stopped in {e.seconds or 0:.1f} s "
                    f"({', '.join(e.signals) or 'no signal needed'}); 0 processes and 0 "
                    f"segments left ({len(e.shm_removed)} removed)",
                )
            )
    return out
