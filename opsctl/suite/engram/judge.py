"""Engram host tables: layout of one shared allocation, what to verify, and findings.

Pure logic (no I/O, no UI). The collector (opsctl.suite.engram.collect) reads /proc and
/dev/shm and hands snapshots (and the table bytes :func:`boundary_windows` asks for)
here; the library calls (opsctl.suite.engram.run_tables) turn them into findings,
verdicts and the clean rules below, which the CLI and the TUI render alike.

Layout of one shared table (vLLM ``DPSharedEngramStorage``): one allocation of
``rows*dim`` bytes of fp8 e4m3 weights followed by ``rows*dim/B`` bytes of ue8m0
scales, one scale byte per B-element block. So

    total = rows*dim + rows*dim/B = rows*dim * (1 + 1/B)
    weight_bytes = total * B / (B + 1)        scale_bytes = total / (B + 1)

and a size is a valid B-table exactly when ``total`` is a multiple of ``B + 1``.

Block size: **vLLM 0.32 builds every Engram table with B = 32** (``ParallelEngramEmbedding``
``block_size=32``, never overridden by its caller; MXFP8-style blocks), so 32 is the
default and preferred layout. B = 128 (the issue's / DeepSeek checkpoint block) is still
recognised. A size can fit both (a 32-block table of dim 256 whose rows are a multiple of
43: 264*rows is then a multiple of 129), so the size alone does not decide:
:func:`decide_layout` reads the bytes at each candidate's weight/scale boundary and takes
the block for which the candidate scale region starts with ue8m0-like bytes (dummy fill:
127) while the bytes before it do not (dummy fill: fp8 0x38). Only when the data cannot
be read or does not tell does it fall back to 32, and says so. ``--block-size`` forces it.

In dummy-load mode every weight byte is 0x38 (fp8 e4m3 1.0) and every scale byte is
127 (ue8m0 2^0 = 1.0): "constant" below means exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding
from opsctl.errors import BadInput

PREFIX = "vllm_engram_"
FP8_E4M3_ONE = 0x38
UE8M0_ONE = 127
DEFAULT_BLOCK = 32  # vLLM 0.32: ParallelEngramEmbedding(block_size=32)
BLOCKS = (32, 128)  # preference order: what vLLM 0.32 builds, then 128-element blocks
PROBE_BYTES = 4096  # bytes read on each side of a candidate weight/scale boundary
PAGE = 4096
VERIFY_MODES = ("none", "sample", "full")


@dataclass(frozen=True, slots=True)
class TableLayout:
    """How an Engram table's bytes split: fp8 weights first, then ue8m0 scales per block."""

    total: int
    weight_bytes: int
    scale_bytes: int
    block: int

    def regions(self) -> tuple[Region, Region]:
        """The weights and scales regions, each with the constant dummy fill writes there."""
        return (
            Region("weights", 0, self.weight_bytes, FP8_E4M3_ONE),
            Region("scales", self.weight_bytes, self.total, UE8M0_ONE),
        )

    def rows_times_dim(self) -> int:
        """Rows x embedding dimension: one fp8 byte per weight."""
        return self.weight_bytes


@dataclass(frozen=True, slots=True)
class Region:
    """A byte range of a table, and the value every byte holds in dummy mode."""

    name: str
    start: int  # byte offset in the table
    end: int
    value: int  # the constant every byte holds in dummy mode

    @property
    def size(self) -> int:
        """The region's length in bytes."""
        return self.end - self.start


def candidate_layouts(total: int, blocks: tuple[int, ...] = BLOCKS) -> list[TableLayout]:
    """Every weight/scale split of ``total`` bytes that a block size allows.

    One per block size that fits, in ``blocks`` order.
    """
    out: list[TableLayout] = []
    if total <= 0:
        return out
    for block in blocks:
        if block < 1 or total % (block + 1):
            continue
        weight = total // (block + 1) * block
        if weight > 0:
            out.append(TableLayout(total, weight, total - weight, block))
    return out


def split_table(total: int, blocks: tuple[int, ...] = BLOCKS) -> TableLayout | None:
    """The preferred split of ``total`` bytes by size alone, or None.

    The first fitting block of ``blocks`` (32 before 128); None if no block size fits. Use
    :func:`decide_layout` when the table's bytes can be read: it resolves sizes that fit several
    blocks.
    """
    cands = candidate_layouts(total, blocks)
    return cands[0] if cands else None


def looks_like_scales(data: Any) -> bool:
    """Whether bytes look like ue8m0 scale exponents rather than fp8 weights.

    Whether bytes look like ue8m0 scale exponents: a narrow band around 127 (2^0),
    no 0xFF (NaN) and no 0x00. fp8 weights are not: dummy 0x38 is far from 127, and real
    weights carry both signs (bytes on both sides of 0x80), a spread over 64.
    """
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.size == 0 or (arr == 0xFF).any() or (arr == 0).any():
        return False
    return int(arr.max()) - int(arr.min()) <= 64 and 79 <= float(np.median(arr)) <= 151


@dataclass(frozen=True, slots=True)
class LayoutDecision:
    """The layout chosen for a table, how it was chosen and the block sizes that fit."""

    layout: TableLayout | None
    how: str  # forced | size | data | default | none
    detail: str
    candidates: tuple[int, ...]  # block sizes the size fits

    def to_dict(self) -> dict[str, Any]:
        """The decision as the report's ``layout`` object holds it."""
        return {
            "block": self.layout.block if self.layout else None,
            "how": self.how,
            "detail": self.detail,
            "candidates": list(self.candidates),
        }


Window = tuple[int, int]  # (offset, length) of table bytes


def boundary_windows(
    total: int | None, forced: int | None = None, blocks: tuple[int, ...] = BLOCKS
) -> tuple[Window, ...]:
    """The table bytes that must be read to decide its layout (often none).

    The table bytes :func:`decide_layout` needs to see: both sides of every candidate's
    weight/scale boundary, only when the size fits several block sizes and none is
    forced (else the size decides and nothing needs reading).
    """
    if not total or total <= 0 or forced is not None:
        return ()
    cands = candidate_layouts(total, blocks)
    if len(cands) < 2:
        return ()
    out: list[Window] = []
    for lay in cands:
        n = min(PROBE_BYTES, lay.scale_bytes, lay.weight_bytes)
        out += [(lay.weight_bytes, n), (lay.weight_bytes - n, n)]
    return tuple(out)


def decide_layout(
    total: int | None,
    data: Mapping[Window, bytes] | None = None,
    forced: int | None = None,
    blocks: tuple[int, ...] = BLOCKS,
) -> LayoutDecision:
    """Which block size the table of ``total`` bytes uses, and how that was decided.

    ``forced`` (``--block-size``) wins. Else a size that fits one block decides; a size
    that fits several is decided from ``data``, the bytes of :func:`boundary_windows`
    read by the collector (None: the table could not be read): smallest block first,
    the first candidate whose scale region starts with scale-like bytes and whose
    weights end with non-scale bytes wins. If nothing can be read or nothing is
    consistent: 32, vLLM 0.32's block size."""
    if not total or total <= 0:
        return LayoutDecision(None, "none", "table size not known", ())
    if forced is not None:
        lay = split_table(total, (forced,))
        if lay is None:
            return LayoutDecision(
                None,
                "forced",
                f"--block-size {forced}: {total} bytes is not rows*dim*(1+1/{forced})",
                (),
            )
        return LayoutDecision(lay, "forced", f"--block-size {forced}", (forced,))
    cands = candidate_layouts(total, blocks)
    blks = tuple(c.block for c in cands)
    if not cands:
        return LayoutDecision(
            None, "none", f"{total} bytes is not rows*dim*(1+1/B) for B in {blocks}", ()
        )
    if len(cands) == 1:
        return LayoutDecision(cands[0], "size", f"only B={blks[0]} fits {total} bytes", blks)
    if data is not None:
        lay = _layout_from_data(cands, data)
        if lay is not None:
            others = ", ".join(str(b) for b in blks if b != lay.block)
            return LayoutDecision(
                lay,
                "data",
                f"size fits B in {list(blks)}; B={lay.block} from the data: bytes from "
                f"offset {lay.weight_bytes} are ue8m0 scales and the bytes before are "
                f"not (B={others} is inconsistent with them)",
                blks,
            )
        why = "the bytes at the candidate boundaries are not consistent with any of them"
    else:
        why = "the table could not be read to tell"
    pref = next(c for c in cands if c.block == DEFAULT_BLOCK) if DEFAULT_BLOCK in blks else cands[0]
    return LayoutDecision(
        pref,
        "default",
        f"size fits B in {list(blks)} and {why}; assuming B={pref.block} "
        f"(vLLM 0.32 builds Engram tables with B=32); --block-size forces it",
        blks,
    )


def _layout_from_data(cands: list[TableLayout], data: Mapping[Window, bytes]) -> TableLayout | None:
    for lay in sorted(cands, key=lambda c: c.block):
        n = min(PROBE_BYTES, lay.scale_bytes, lay.weight_bytes)
        head = data.get((lay.weight_bytes, n))
        tail = data.get((lay.weight_bytes - n, n))
        if head is None or tail is None:
            continue
        if looks_like_scales(head) and not looks_like_scales(tail):
            return lay
    return None


def size_from_mapping(
    vma_bytes: int, tail: Any | None, blocks: tuple[int, ...] = BLOCKS
) -> int | None:
    """The table size behind a page-rounded mapping, from its last page; None if unknown.

    For a deleted file read through /proc/PID/mem (no map_files to stat). In the last
    page ``tail`` the mapping's bytes past the file's end read as 0 and a table never
    ends in 0 (last byte is a ue8m0 scale, 127 in dummy fill; ue8m0 0 would be 2^-127),
    so the size is one past the last non-zero byte. None when the tail is unknown or all zero, or the size found fits no
    block: the size is then unknown, never guessed.
    """
    if tail is None or vma_bytes <= 0:
        return None
    import numpy as np

    arr = np.frombuffer(tail, dtype=np.uint8)
    nz = np.flatnonzero(arr)
    if not nz.size:
        return None
    size = vma_bytes - arr.size + int(nz[-1]) + 1
    return size if candidate_layouts(size, blocks) else None


def sample_windows(
    layout: TableLayout, windows: int = 64, window_bytes: int = 64 * 1024
) -> list[Region]:
    """Sample mode: evenly spaced windows in each region, its first and last bytes included.

    So both region boundaries are checked.
    """
    out: list[Region] = []
    for region in layout.regions():
        if region.size <= windows * window_bytes:
            out.append(region)
            continue
        step = (region.size - window_bytes) / (windows - 1)
        for i in range(windows):
            start = region.start + int(i * step)
            out.append(
                Region(region.name, start, min(start + window_bytes, region.end), region.value)
            )
    return out


def verify_plan(layout: TableLayout, mode: str) -> list[Region]:
    """The regions to verify in ``mode``: all (full), sampled windows (sample) or none."""
    if mode == "full":
        return list(layout.regions())
    if mode == "sample":
        return sample_windows(layout)
    return []


def first_mismatch(data: Any, value: int) -> int | None:
    """Index of the first byte in ``data`` (bytes-like) that is not ``value``."""
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    bad = np.flatnonzero(arr != value)
    return int(bad[0]) if bad.size else None


# ---- findings ------------------------------------------------------------------------


INCOMPLETE = ("denied", "error", "unverifiable")  # verify statuses: requested, not done


def table_findings(table: dict[str, Any], pids_given: bool = False) -> list[Finding]:
    """Findings for one table as the collector reports it (``TableReport.to_dict()``).

    ``pids_given``: inspect looked only at some processes' mappings (``--pid``), so a linked
    file no listed process maps is not known to be an orphan.
    """
    out = _layout_findings(table)
    out += _mapper_findings(table, pids_given)
    verify = _verify_finding(table)
    return out + ([verify] if verify is not None else [])


def _layout_findings(table: dict[str, Any]) -> list[Finding]:
    name = table["name"]
    layout = table.get("layout")
    choice = table.get("block_choice") or {}
    if layout is None and table.get("size_bytes"):
        detail = choice.get("detail") or "no Engram layout"
        return [Finding(WARNING, "engram.layout_unknown", f"{name}: {detail}", {"table": name})]
    if layout is not None and choice.get("how") in ("data", "default"):
        return [
            Finding(
                INFO if choice["how"] == "data" else WARNING,
                "engram.block_size",
                f"{name}: scale block B={layout['block']} ({choice['how']}): {choice['detail']}",
                {"table": name, **choice},
            )
        ]
    return []


def _mapper_findings(table: dict[str, Any], pids_given: bool) -> list[Finding]:
    name = table["name"]
    out: list[Finding] = []
    mappers = table.get("mappers", [])
    if not mappers and table.get("linked") and not pids_given:
        out.append(
            Finding(
                INFO,
                "engram.orphan",
                f"{name}: no live process maps it (orphan; see `opsctl engram clean`)",
                {"table": name},
            )
        )
    if len({m["pid"] for m in mappers}) > 1:
        pss = [m["pss_bytes"] for m in mappers if m.get("pss_bytes") is not None]
        rss = [m["rss_bytes"] for m in mappers if m.get("rss_bytes") is not None]
        if pss and rss and sum(pss) <= 1.1 * max(rss):
            out.append(
                Finding(
                    OK,
                    "engram.shared",
                    f"{name}: {len(mappers)} mappings share one copy (sum PSS {sum(pss)} ≈ RSS {max(rss)})",
                    {"table": name},
                )
            )
    for m in mappers:
        if m.get("error"):
            out.append(
                Finding(
                    INFO,
                    "engram.mapper_gone",
                    f"{name}: pid {m['pid']}: {m['error']}",
                    {"table": name, "pid": m["pid"]},
                )
            )
    return out


def _verify_finding(table: dict[str, Any]) -> Finding | None:
    name = table["name"]
    v = table.get("verify") or {}
    status = v.get("status")
    if status == "constant":
        block = (table.get("layout") or {}).get("block")
        return Finding(
            OK,
            "engram.fill_constant",
            f"{name}: {v['mode']} verify: constant (weights 0x38, scales 127, "
            f"B={block}), {v['checked_bytes']} bytes via {v['access']}",
            {"table": name},
        )
    if status == "mismatch":
        mm = v["first_mismatch"]
        return Finding(
            FAIL,
            "engram.fill_mismatch",
            f"{name}: not constant: first differing byte at offset {mm['offset']} "
            f"({mm['region']}) is {mm['value']:#04x}, expected {mm['expected']:#04x}",
            {"table": name, **mm},
        )
    if status in ("denied", "error"):
        code, what = (
            ("engram.permission", "cannot read the table")
            if status == "denied"
            else ("engram.verify_error", "verification failed")
        )
        return Finding(
            WARNING,
            code,
            f"{name}: {what}: {v.get('error')}",
            {"table": name, "hint": v.get("hint")},
        )
    if status == "unverifiable":
        return Finding(
            WARNING,
            "engram.unverifiable",
            f"{name}: cannot verify: {v.get('reason')}",
            {"table": name, "hint": "pass --block-size if the size fits a block size"},
        )
    if status == "skipped" and v.get("reason"):
        return Finding(
            INFO, "engram.verify_skipped", f"{name}: verify skipped: {v['reason']}", {"table": name}
        )
    return None


def scan_findings(scan_errors: list[dict[str, Any]], as_root: bool = False) -> list[Finding]:
    """Processes whose maps could not be read: exits are info, denials a warning + hint."""
    denied = [e for e in scan_errors if "permission" in e["reason"]]
    out = []
    if denied:
        hint = (
            "these processes are not dumpable or live in another PID/user namespace; run "
            "opsctl inside the vLLM container (or with CAP_SYS_PTRACE there)"
            if as_root
            else "run as root or as the user that runs vLLM (reading another user's mappings needs "
            "ptrace access), or pass --pid for the vLLM processes"
        )
        pids = [e["pid"] for e in denied]
        out.append(
            Finding(
                WARNING,
                "engram.permission",
                f"could not read /proc/PID/maps of {len(denied)} process(es) "
                f"(pids {', '.join(map(str, pids[:8]))}{', ...' if len(pids) > 8 else ''}); tables they map may be missing",
                {"pids": pids[:50], "hint": hint},
            )
        )
    gone = [e for e in scan_errors if "exited" in e["reason"]]
    if gone:
        out.append(
            Finding(
                INFO,
                "engram.process_exited",
                f"{len(gone)} process(es) exited during the scan",
                {"pids": [e["pid"] for e in gone]},
            )
        )
    return out


def inspect_findings(
    tables: list[dict[str, Any]],
    scan_errors: list[dict[str, Any]],
    as_root: bool = False,
    pids_given: bool = False,
) -> list[Finding]:
    """The findings of ``engram inspect``: scan errors, each table's, incomplete verifications."""
    out = scan_findings(scan_errors, as_root)
    if not tables:
        out.append(Finding(INFO, "engram.none", f"no {PREFIX}* tables found (files or mappings)"))
    for t in tables:
        out.extend(table_findings(t, pids_given))
    incomplete = [t for t in tables if (t.get("verify") or {}).get("status") in INCOMPLETE]
    if incomplete:
        names = ", ".join(f"{t['name']} ({t['verify']['status']})" for t in incomplete[:5])
        out.append(
            Finding(
                FAIL,
                "engram.verify_incomplete",
                f"verification was requested but could not complete for {len(incomplete)} "
                f"table(s): {names}{', ...' if len(incomplete) > 5 else ''}",
                {"tables": [t["name"] for t in incomplete]},
            )
        )
    return out


def exit_status(findings: list[Finding]) -> int:
    """The exit code of ``engram inspect``: 0 when every table verifies, else 1.

    0 when every table verifies (or nothing to verify); 1 on a fill mismatch, or when
    verification was requested and could not complete for some table (denied, read
    error, unknown size/layout). A table whose mappers all exited mid-scan is gone, not
    unverified.
    """
    bad = ("engram.fill_mismatch", "engram.verify_incomplete")
    return 1 if any(f.code in bad for f in findings) else 0


def inspect_failure(findings: list[Finding]) -> str | None:
    """The one line ``engram inspect`` fails with (exit 1), None when it passes.

    A fill mismatch comes first, else the incomplete verification (as :func:`exit_status`
    decides).
    """
    bad = [f for f in findings if f.code == "engram.fill_mismatch"]
    if bad:
        return f"{len(bad)} Engram table(s) not constant-filled: {bad[0].message}"
    inc = next((f for f in findings if f.code == "engram.verify_incomplete"), None)
    return inc.message if inc is not None else None


# ---- options ---------------------------------------------------------------------------------


def check_prefix(prefix: str) -> str:
    """``prefix`` when it names Engram tables only, else BadInput.

    Engram tables only: ``vllm_engram_...``, no '/'. Inspect and clean never look at, let alone
    remove, anything else.
    """
    if not prefix.startswith(PREFIX) or "/" in prefix:
        raise BadInput(f"--prefix must start with {PREFIX!r} and contain no '/': {prefix!r}")
    return prefix


def check_inspect_options(verify: str, prefix: str, block: int | None) -> None:
    """Refuse (BadInput) a bad ``--verify`` mode, table prefix or ``--block-size``."""
    if verify not in VERIFY_MODES:
        raise BadInput(f"--verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
    check_prefix(prefix)
    if block is not None and block < 1:
        raise BadInput(f"--block-size must be a positive number of elements, not {block}")


def check_clean_options(prefix: str, yes: bool, force: bool, min_age: float) -> None:
    """Refuse (BadInput) a bad table prefix, ``--force`` without ``--yes``, or ``--min-age``."""
    check_prefix(prefix)
    if force and not yes:
        raise BadInput("--force only makes sense with --yes")
    if not min_age >= 0:
        raise BadInput(f"--min-age must be >= 0 seconds, not {min_age!r}")


# ---- clean -----------------------------------------------------------------------------------

DEFAULT_MIN_AGE = 60.0  # seconds: a segment this fresh may be between shm_open and mmap


def segment_status(held: bool, symlink: bool, age: float, min_age: float) -> str:
    """What ``clean`` may do with one /dev/shm file: symlink, in-use, young or orphan.

    ``symlink``: never touched; ``in-use``: a live process maps it or holds it open;
    ``young``: changed less than ``min_age`` seconds ago (it may be being set up, e.g.
    opened but not yet mapped, or shared by a process whose descriptor is about to be
    passed on); else ``orphan``: it may be removed.
    """
    if symlink:
        return "symlink"
    if held:
        return "in-use"
    if age < min_age:
        return "young"
    return "orphan"


def unreadable_warning(denied: tuple[int, ...] | list[int]) -> str | None:
    """The warning for processes whose maps or fds could not be read (None: none)."""
    if not denied:
        return None
    return (
        f"could not read the mappings or open files of {len(denied)} process(es) "
        f"(pids {', '.join(map(str, denied[:10]))}); files only they hold look orphaned"
    )


def clean_refusal(yes: bool, kept: list[str], denied: tuple[int, ...], force: bool) -> str | None:
    """The refusal line when ``clean --yes`` kept every orphan (unreadable processes), else None.

    The refusal rule: with ``--yes``, when the mappings or open files of some process
    could not be read, a file only that process holds would look orphaned, so every
    orphan is kept (the collector removed nothing) unless ``--force``. Returns the
    refusal line when that happened, else None.
    """
    if not (yes and kept and denied and not force):
        return None
    return (
        f"kept every orphan: the mappings or open files of {len(denied)} process(es) "
        "could not be read, so a file only they hold would look orphaned; run as "
        "root / inside the vLLM container, or pass --force"
    )


def clean_failure(yes: bool, kept: list[str], refused: str | None) -> str | None:
    """Why ``clean --yes`` failed (exit 1), None when it did everything it listed.

    Failed: it kept an orphan it listed (refused, held again, gone, or not removable).
    """
    if not (yes and kept):
        return None
    return refused or (
        f"{len(kept)} orphan(s) kept (held again, gone, or not removable): {', '.join(kept[:5])}"
    )


def clean_hint(yes: bool, orphans: int) -> str | None:
    """What a dry run that listed orphans tells the operator to do next."""
    if yes or not orphans:
        return None
    return f"{orphans} orphan(s) listed; run again with --yes to remove them"
