"""Engram host tables: layout of one shared allocation, what to verify, and findings.

Pure logic (no I/O, no UI). The collector (opsctl.collectors.engram) reads /proc and
/dev/shm and hands snapshots here; CLI and TUI render the same findings.

Layout of one shared table (vLLM ``DPSharedEngramStorage``): one allocation of
``rows*dim`` bytes of fp8 e4m3 weights followed by ``rows*dim/B`` bytes of ue8m0
scales, one scale byte per B-element block. So

    total = rows*dim + rows*dim/B = rows*dim * (1 + 1/B)
    weight_bytes = total * B / (B + 1)        scale_bytes = total / (B + 1)

and a size is a valid table exactly when ``total`` is a multiple of ``B + 1``; then
``weight_bytes`` is integral and a multiple of B, as ``rows*dim`` with ``dim`` a multiple
of B must be (e.g. 4096 rows x 256: total 1,056,768 = 1,048,576 + 8,192). The
issue's contract is B = 128 (``weight_bytes = total*128/129``); vLLM 0.32's
``ParallelEngramEmbedding`` is built with ``block_size=32`` (MXFP8 blocks), so a size
that is not a 128-block table is also tried as a 32-block one. 128 wins when both fit.

In dummy-load mode every weight byte is 0x38 (fp8 e4m3 1.0) and every scale byte is
127 (ue8m0 2^0 = 1.0): "constant" below means exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding

PREFIX = "vllm_engram_"
FP8_E4M3_ONE = 0x38
UE8M0_ONE = 127
DEFAULT_BLOCK = 128
BLOCKS = (128, 32)  # tried in this order when splitting a size
PAGE = 4096
VERIFY_MODES = ("none", "sample", "full")


@dataclass(frozen=True, slots=True)
class TableLayout:
    total: int
    weight_bytes: int
    scale_bytes: int
    block: int

    def regions(self) -> tuple[Region, Region]:
        return (
            Region("weights", 0, self.weight_bytes, FP8_E4M3_ONE),
            Region("scales", self.weight_bytes, self.total, UE8M0_ONE),
        )

    def rows_times_dim(self) -> int:
        return self.weight_bytes


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    start: int  # byte offset in the table
    end: int
    value: int  # the constant every byte holds in dummy mode

    @property
    def size(self) -> int:
        return self.end - self.start


def split_table(total: int, blocks: tuple[int, ...] = BLOCKS) -> TableLayout | None:
    """Weight/scale split of a table of ``total`` bytes, or None if no block size fits."""
    if total <= 0:
        return None
    for block in blocks:
        if total % (block + 1):
            continue
        weight = total // (block + 1) * block
        if weight % block == 0 and weight > 0:
            return TableLayout(total, weight, total - weight, block)
    return None


def size_from_mapping(vma_bytes: int, blocks: tuple[int, ...] = BLOCKS) -> int | None:
    """The table size behind a page-rounded mapping when only the mapping is known
    (deleted file read through /proc/PID/mem): the one valid table size in
    ``(vma_bytes - PAGE, vma_bytes]``. None when there is none or it is ambiguous."""
    for block in blocks:
        unit = (block + 1) * block  # smallest valid table step for this block size
        top = vma_bytes - vma_bytes % unit
        candidates = [s for s in range(top, vma_bytes - PAGE, -unit) if s > 0]
        if len(candidates) == 1:
            return candidates[0]
    return None


def sample_windows(
    layout: TableLayout, windows: int = 64, window_bytes: int = 64 * 1024
) -> list[Region]:
    """Sample mode: evenly spaced windows in each region, always including its first
    and last bytes (so both region boundaries are checked)."""
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


def table_findings(table: dict[str, Any]) -> list[Finding]:
    """Findings for one table as the collector reports it (``TableReport.to_dict()``)."""
    name = table["name"]
    out: list[Finding] = []
    layout = table.get("layout")
    if layout is None:
        out.append(
            Finding(
                WARNING,
                "engram.layout_unknown",
                f"{name}: {table.get('size')} bytes is not rows*dim*(1+1/B) for B in {BLOCKS}",
                {"table": name},
            )
        )
    mappers = table.get("mappers", [])
    if not mappers and table.get("linked"):
        out.append(
            Finding(
                INFO,
                "engram.orphan",
                f"{name}: no live process maps it (orphan; see `opsctl engram clean`)",
                {"table": name},
            )
        )
    if len({m["pid"] for m in mappers}) > 1:
        pss = [m["pss"] for m in mappers if m.get("pss") is not None]
        rss = [m["rss"] for m in mappers if m.get("rss") is not None]
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
    v = table.get("verify") or {}
    status = v.get("status")
    if status == "constant":
        out.append(
            Finding(
                OK,
                "engram.fill_constant",
                f"{name}: {v['mode']} verify: constant (weights 0x38, scales 127), "
                f"{v['bytes_checked']} bytes via {v['access']}",
                {"table": name},
            )
        )
    elif status == "mismatch":
        mm = v["first_mismatch"]
        out.append(
            Finding(
                FAIL,
                "engram.fill_mismatch",
                f"{name}: not constant: first differing byte at offset {mm['offset']} "
                f"({mm['region']}) is {mm['value']:#04x}, expected {mm['expected']:#04x}",
                {"table": name, **mm},
            )
        )
    elif status == "denied":
        out.append(
            Finding(
                WARNING,
                "engram.permission",
                f"{name}: cannot read the table: {v.get('error')}",
                {"table": name, "hint": v.get("hint")},
            )
        )
    elif status == "error":
        out.append(
            Finding(
                WARNING,
                "engram.verify_error",
                f"{name}: verification failed: {v.get('error')}",
                {"table": name, "hint": v.get("hint")},
            )
        )
    elif status == "skipped" and v.get("reason"):
        out.append(
            Finding(
                INFO,
                "engram.verify_skipped",
                f"{name}: verify skipped: {v['reason']}",
                {"table": name},
            )
        )
    return out


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
    tables: list[dict[str, Any]], scan_errors: list[dict[str, Any]], as_root: bool = False
) -> list[Finding]:
    out = scan_findings(scan_errors, as_root)
    if not tables:
        out.append(Finding(INFO, "engram.none", f"no {PREFIX}* tables found (files or mappings)"))
    for t in tables:
        out.extend(table_findings(t))
    return out


def exit_status(findings: list[Finding]) -> int:
    """0 when every table verifies (or nothing to verify), 1 on any fill mismatch."""
    return 1 if any(f.code == "engram.fill_mismatch" for f in findings) else 0
