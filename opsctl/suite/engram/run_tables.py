"""Engram host tables (DeepSeek V4.1) as library calls: ``inspect``, ``plan``, ``clean``.

Unlike the engine checks these look at this node, not at a server: ``inspect`` and
``clean`` read /dev/shm and /proc (the ``vllm_engram_*`` tables, who maps or holds
them), ``plan`` reads a model config. So they take no target and no engine session:

- ``inspect(InspectOptions, progress) -> EngramReport`` (schema ``engram.inspect/2``):
  every table, its mappers with RSS/PSS, block size and fill verification; verdict fail
  on a fill mismatch or when verification was requested but could not complete.
- ``plan(PlanOptions) -> EngramReport`` (``engram.plan/2``): table bytes per rank and per
  node for a TP/DP layout, and whether /dev/shm holds them (vLLM's fallback decision).
- ``clean(CleanOptions, progress) -> EngramReport`` (``engram.clean/2``): orphaned tables
  (no live process in this PID namespace maps them or holds them open, older than
  ``min_age``), removed only with ``yes``; the refusal rule is
  :func:`opsctl.suite.engram.judge.clean_refusal`.

Options are checked when built (BadInput). Example::

    from opsctl.checks import engram
    report = engram.inspect(engram.InspectOptions(verify="full"))
    print(report.verdict, [t["name"] for t in report.to_dict()["tables"]])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, PASS, Report
from opsctl.errors import BadInput
from opsctl.suite.engram import judge

# /2 (issue 23): units in the field names and null for unknown. inspect: shm.{total,used,
# free}_bytes, tables[].size_bytes, layout.total_bytes, mappers[].{rss,pss,locked}_bytes,
# verify.{checked_bytes,duration_s}, platform a name or null + platform_note. plan:
# shm_{total,free}_bytes, total_gib dropped (total_bytes says it). clean: min_age_s,
# orphans[]/young[].{size_bytes,age_s}.
INSPECT_SCHEMA = "engram.inspect/2"
PLAN_SCHEMA = "engram.plan/2"
CLEAN_SCHEMA = "engram.clean/2"

# the results table (rich output and the --tui panel)
COLUMNS = ("table", "size", "split (w/s)", "linked", "mappers", "RSS / PSS each", "verify")


@dataclass(frozen=True)
class EngramReport(Report):
    """An Engram report, with the lines the CLI says around it.

    ``failure``: the line a failed verdict is reported with (the CLI's exit-1 error);
    ``warnings``: said before the result; ``hint``: what to do next (clean dry run)."""

    failure: str | None = None
    warnings: tuple[str, ...] = ()
    hint: str | None = None


# ---- inspect ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InspectOptions:
    """Which processes and tables ``engram inspect`` reads, and how much it verifies."""

    pids: tuple[int, ...] = ()  # only these processes' mappings; () = every process
    verify: str = "sample"  # none | sample | full
    prefix: str = judge.PREFIX  # narrow it to one run's tables
    block_size: int | None = None  # force the ue8m0 scale block (None: decided per table)

    def __post_init__(self) -> None:
        judge.check_inspect_options(self.verify, self.prefix, self.block_size)


def inspect(
    options: InspectOptions = InspectOptions(), progress: ev.Progress = ev.ignore
) -> EngramReport:
    """Find, measure and verify every Engram table visible from here."""
    from opsctl.domain.findings import verdict
    from opsctl.output import document
    from opsctl.suite.engram import collect

    pids = sorted(set(options.pids))
    gone = collect.missing_pids(pids)
    if gone:
        raise BadInput(f"no such process: {', '.join(map(str, gone))}")
    progress(ev.Table(COLUMNS, ()))
    progress(ev.Phase("scanning /dev/shm and /proc/*/maps"))
    snap = collect.inspect(
        pids or None,
        options.verify,
        options.prefix,
        progress=_collector_progress(progress),
        block=options.block_size,
    )
    data = collect.snapshot_to_dict(snap)
    findings = judge.inspect_findings(
        data["tables"], data["scan_errors"], as_root=os.geteuid() == 0, pids_given=bool(pids)
    )
    result = verdict(findings)
    progress(ev.Phase("done"))  # the findings are the result (stdout), not progress
    shm = data["shm"]
    progress(
        ev.Finished(
            result,
            f"{len(data['tables'])} table(s); /dev/shm free {shm['free_bytes']} of "
            f"{shm['total_bytes']} bytes",
            tuple(table_row(t) for t in data["tables"]),
        )
    )
    doc = document(
        INSPECT_SCHEMA,
        **_mapper_identity(data["tables"]),
        verify=options.verify,
        pids=pids or None,
        block_size=options.block_size,
        **data,
        findings=[f.to_dict() for f in findings],
        verdict=result,
        exit_code=judge.exit_status(findings),
    )
    return EngramReport(result, doc, failure=judge.inspect_failure(findings))


def _mapper_identity(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """``platform`` (a device name or null, ``platform_note`` saying why when null) and
    ``vllm_version`` of the processes that map the tables, where an engine opsctl started
    recorded them (its ledger)."""
    from opsctl.collectors.engine_records import identity_of_pids
    from opsctl.domain import platform as plat

    pids = sorted({p for t in tables for p in t.get("mapper_pids") or []})
    known = identity_of_pids(pids)
    if not pids:
        why = "no process maps a table"
    elif not known:
        why = "no mapping process was started by opsctl (no patch ledger names it)"
    else:
        why = "the mapping processes' ledgers name no platform"
    return {
        **plat.agreed([p for p, _ in known.values()], why),
        "vllm_version": plat.joined([v for _, v in known.values()]),
        "platform_pids": sorted(known),
    }


def _collector_progress(progress: ev.Progress):
    """The collector's (stage, data) callback, as typed events."""

    def notify(stage: str, data: dict[str, Any]) -> None:
        if stage == "maps":
            progress(ev.Phase("reading smaps"))
            progress(ev.Log(f"{data['mappings']} mapping(s), {data['files']} file(s)"))
        elif stage == "verify":
            progress(ev.Phase(f"verifying ({data['mode']})"))
            progress(ev.Log(f"table {data['table']} ({data['size']} bytes)"))

    return notify


def table_row(t: dict[str, Any]) -> tuple[str, ...]:
    """One table (``TableReport.to_dict()``) as a row of :data:`COLUMNS`."""
    from opsctl.output import human_bytes

    lay = t.get("layout")
    split = (
        f"{human_bytes(lay['weight_bytes'])} / {human_bytes(lay['scale_bytes'])} "
        f"(B={lay['block']}, {t.get('block_choice', {}).get('how', '?')})"
        if lay
        else "?"
    )
    ms = t["mappers"]
    each = ", ".join(
        f"{m['pid']}:{human_bytes(m['rss_bytes'])}/{human_bytes(m['pss_bytes'])}"
        if m.get("rss_bytes") is not None
        else f"{m['pid']}:gone"
        for m in ms
    )
    size = human_bytes(t["size_bytes"]) + (
        "" if t["size_source"] in ("file", "map_files") else " ~"
    )
    linked = "yes" if t["linked"] else "deleted"
    return (
        t["name"],
        size,
        split,
        linked,
        str(len({m["pid"] for m in ms})),
        each or "-",
        _verify_text(t["verify"]),
    )


def _verify_text(v: dict[str, Any]) -> str:
    if v["status"] == "mismatch":
        mm = v["first_mismatch"]
        return f"MISMATCH @{mm['offset']} = {mm['value']:#04x} (want {mm['expected']:#04x})"
    if v["status"] == "constant":
        return f"constant ({v['mode']}, {v['access']})"
    if v["status"] in ("denied", "error"):
        return f"{v['status'].upper()}: {v.get('error')}"
    if v["status"] == "unverifiable":
        return f"UNVERIFIABLE: {v.get('reason')}"
    if v.get("reason"):
        return f"skipped: {v['reason']}"
    return v["status"]


# ---- plan ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What ``engram plan`` sizes: a model directory or a config, with its layout.

    Exactly one of ``model`` (a directory with config.json) and ``config`` (a config
    JSON file or a shipped example name, e.g. "deepseek-v4.1-flash")."""

    model: Path | None = None
    config: str | None = None
    tp: int = 1
    dp: int = 1
    nodes: int = 1
    shm_size: str | None = None  # /dev/shm size to plan for ("64M"); None: this host's free
    block_size: int | None = None  # elements per scale byte (None: config, else 32)


def plan(options: PlanOptions) -> EngramReport:
    """Engram table bytes per rank/node for TP/DP, shared vs private, the /dev/shm check.

    Bad configs or layouts are BadInput."""
    from opsctl.collectors import shm
    from opsctl.output import document
    from opsctl.suite.engram import judge_plan
    from opsctl.suite.engram.collect_config import read_config

    cfg, source = read_config(options.model, options.config)
    try:
        spec = judge_plan.spec_from_config(cfg, block=options.block_size)
        if options.shm_size is not None:
            size = judge_plan.parse_size(options.shm_size)
            free, total, shm_source = size, size, f"--shm-size {options.shm_size}"
        else:
            cap = shm.capacity()
            free, total, shm_source = cap.free, cap.total, "/dev/shm on this host"
        layout = judge_plan.make_plan(
            spec,
            tp=options.tp,
            dp=options.dp,
            nodes=options.nodes,
            shm_free=free,
            shm_total=total,
            shm_source=shm_source,
        )
    except judge_plan.PlanError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read /dev/shm: {exc}", hint="pass --shm-size") from None
    return EngramReport(PASS, document(PLAN_SCHEMA, source=source, **layout.to_dict()))


# ---- clean -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CleanOptions:
    """Which orphaned Engram tables ``engram clean`` lists, and whether it removes them."""

    prefix: str = judge.PREFIX  # only files with this prefix
    yes: bool = False  # really remove the orphans (default: only list them)
    force: bool = False  # with yes: remove even though some processes could not be read
    min_age: float = judge.DEFAULT_MIN_AGE  # never remove a table changed more recently

    def __post_init__(self) -> None:
        judge.check_clean_options(self.prefix, self.yes, self.force, self.min_age)


def clean(
    options: CleanOptions = CleanOptions(), progress: ev.Progress = ev.ignore
) -> EngramReport:
    """List (and with ``yes`` remove) orphaned Engram tables in /dev/shm.

    Verdict fail when ``yes`` kept an orphan it listed (refused, held again, gone, not
    removable)."""
    from opsctl.output import document
    from opsctl.suite.engram import collect_clean

    o = options
    progress(ev.Phase("scanning /dev/shm and /proc/*/{maps,fd}"))
    scan = collect_clean.find_orphans(o.prefix, min_age=o.min_age)
    warning = judge.unreadable_warning(scan.denied_pids)
    if warning:
        progress(ev.Alert(warning))
    removed: list[str] = []
    kept: list[str] = []
    denied = scan.denied_pids
    if o.yes and scan.orphans:
        progress(ev.Phase("removing orphans"))
        names = [x.name for x in scan.orphans]
        removed, kept, denied = collect_clean.remove_orphans(
            names, o.prefix, force=o.force, min_age=o.min_age
        )
        for name in removed:
            progress(ev.Log(f"removed {name}"))
    refused = judge.clean_refusal(o.yes, kept, denied, o.force)
    doc = document(
        CLEAN_SCHEMA,
        prefix=o.prefix,
        dry_run=not o.yes,
        min_age_s=o.min_age,
        orphans=[_file(x) for x in scan.orphans],
        mapped=list(scan.mapped),
        open=list(scan.open),
        young=[_file(x) for x in scan.young],
        ignored_symlinks=list(scan.symlinks),
        removed=removed,
        kept=kept,
        unchecked_pids=list(denied),
        forced=o.force,
        refused=refused,
    )
    failure = judge.clean_failure(o.yes, kept, refused)
    progress(ev.Finished(FAIL if failure else PASS, failure or f"{len(removed)} removed"))
    return EngramReport(
        FAIL if failure else PASS,
        doc,
        failure=failure,
        warnings=(warning,) if warning else (),
        hint=judge.clean_hint(o.yes, len(scan.orphans)),
    )


def _file(x: Any) -> dict[str, Any]:
    return {
        "name": x.name,
        "path": x.path,
        "size_bytes": x.size,
        "mtime": x.mtime,
        "age_s": x.age,
    }
