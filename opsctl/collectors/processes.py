"""Process-tree snapshots via psutil; a vanished or denied process is a field, not a crash.

The field says why (gone, access denied)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from opsctl.console.judge import ProcRole
from opsctl.domain import ranks


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """One process of a vLLM tree: ids, role, command line, CPU and memory."""

    pid: int
    ppid: int
    name: str
    role: str
    cmdline: str
    cpu_percent: float | None
    rss: int | None
    pss: int | None
    status: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessTree:
    """The processes of one vLLM tree at one moment."""

    root_pid: int
    taken_at: float
    processes: tuple[ProcInfo, ...]

    @property
    def total_rss(self) -> int:
        """Resident memory of all the tree's processes, in bytes (unknown counted as 0)."""
        return sum(p.rss or 0 for p in self.processes)

    @property
    def total_pss(self) -> int | None:
        """Proportional memory of the tree, in bytes; None when one process's PSS is unknown."""
        if any(p.pss is None for p in self.processes):
            return None
        return sum(p.pss or 0 for p in self.processes)


def classify(name: str, cmdline: str, is_root: bool) -> str:
    """The vLLM role of a process (``EngineCore_DP1``, ``Worker_TP0``...) by its title.

    vLLM's process titles (opsctl.domain.ranks); the root is the API server; a helper
    process (compiler, resource tracker) by its name."""
    rank = ranks.parse_title(f"{cmdline} {name}")
    if rank is not None:
        return rank.role
    if is_root:
        return ranks.API_SERVER
    if "resource_tracker" in cmdline:
        return "resource tracker"
    if "g++" in name or "cc1plus" in name or name in ("c++", "cc", "gcc", "ld", "as"):
        return "compiler"
    return name or "process"


_CPU_CACHE: dict[int, psutil.Process] = {}


def _proc(pid: int) -> psutil.Process:
    """Reuse Process objects so cpu_percent() measures since the previous snapshot."""
    p = _CPU_CACHE.get(pid)
    if p is None or not p.is_running():
        p = psutil.Process(pid)
        _CPU_CACHE[pid] = p
    return p


def read_proc(p: psutil.Process, is_root: bool) -> ProcInfo:
    """Read one process into a :class:`ProcInfo`; what cannot be read is a reason."""
    pid = p.pid
    try:
        with p.oneshot():
            name = p.name()
            cmdline = " ".join(p.cmdline())
            ppid = p.ppid()
            status = p.status()
            cpu = p.cpu_percent(None)
            rss = p.memory_info().rss
    except psutil.NoSuchProcess:
        return ProcInfo(
            pid, 0, "?", "gone", "", None, None, None, "gone", "process exited during read"
        )
    except psutil.AccessDenied as exc:
        return ProcInfo(pid, 0, "?", "?", "", None, None, None, "?", f"access denied: {exc}")
    pss: int | None = None
    error = None
    try:
        pss = int(getattr(p.memory_full_info(), "pss", 0)) or None
    except psutil.AccessDenied:
        error = "PSS: access denied (/proc/PID/smaps_rollup)"
    except psutil.NoSuchProcess:
        error = "process exited during read"
    role = classify(name, cmdline, is_root)
    return ProcInfo(pid, ppid, name, role, cmdline[:200], cpu, rss, pss, status, error)


def snapshot_tree(root_pid: int) -> ProcessTree:
    """The root process and all its descendants (empty when the root is gone)."""
    try:
        root = _proc(root_pid)
        members = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return ProcessTree(root_pid, time.time(), ())
    procs = []
    for p in members:
        try:
            cached = _proc(p.pid)
        except psutil.NoSuchProcess:
            continue
        procs.append(read_proc(cached, is_root=p.pid == root_pid))
    kept = [x for x in procs if x.status != "gone"]
    return ProcessTree(root_pid, time.time(), tuple(_ranked(kept, root_pid)))


def _ranked(procs: list[ProcInfo], root_pid: int) -> list[ProcInfo]:
    """``procs`` in rank order, a data-parallel worker's role naming its engine.

    Such a worker reads ``Worker_DP1``. The order is the tree's (a parent before its
    children) with siblings in rank order (:func:`opsctl.domain.ranks.order_key`): API
    server, coordinator, ``EngineCore_DP0`` and its workers, ``EngineCore_DP1``..., helpers
    last."""
    import dataclasses

    found = ranks.rank_ids(
        [ranks.Member(p.pid, p.ppid, f"{p.cmdline} {p.name}", p.pid == root_pid) for p in procs]
    )
    named = []
    for p in procs:
        rank = found.get(p.pid)
        if rank is not None and rank.role != p.role and rank.kind == ranks.WORKER:
            p = dataclasses.replace(p, role=rank.role)
        named.append(p)
    return tree_order(named, root_pid)


def tree_order(procs: list[ProcInfo], root_pid: int) -> list[ProcInfo]:
    """``procs`` depth first from ``root_pid``, siblings in rank order (orphans last)."""
    return ranks.tree_order(procs, root_pid, lambda p: p.pid, lambda p: p.ppid, lambda p: p.role)


def descendants(root_pid: int) -> list[int]:
    """The pids of every descendant of ``root_pid``; ``[]`` when it is gone."""
    try:
        return [c.pid for c in psutil.Process(root_pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    """Which of ``pids`` still run (zombies do not count)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def members(pid: int) -> list[tuple[int, str, str | None]]:
    """(pid, vLLM role, process state) of the API server ``pid`` and its descendants.

    In rank order (the tree's, siblings by rank). Cheap: no memory reads; a process that
    exits meanwhile is simply not listed."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    read = []
    for p in procs:
        try:
            with p.oneshot():
                name, cmdline = p.name(), " ".join(p.cmdline())
                read.append((p.pid, p.ppid(), name, cmdline, p.status()))
        except psutil.Error:
            continue
    found = ranks.rank_ids([ranks.Member(q, pp, f"{c} {n}", q == pid) for q, pp, n, c, _ in read])
    out = []
    for q, pp, name, cmdline, state in read:
        rank = found.get(q)
        role = rank.role if rank is not None else classify(name, cmdline, q == pid)
        out.append((q, pp, role, state))
    ordered = ranks.tree_order(out, pid, lambda m: m[0], lambda m: m[1], lambda m: m[2])
    return [(q, role, state) for q, _pp, role, state in ordered]


def process_roles(pid: int) -> tuple[ProcRole, ...]:
    """The API server and its descendants with their vLLM roles."""
    return tuple(ProcRole(p, role) for p, role, _state in members(pid))


def stopped_members(pid: int) -> tuple[ProcRole, ...]:
    """The processes of the tree that are stopped (SIGSTOP, a debugger's stop)."""
    return tuple(ProcRole(p, role) for p, role, state in members(pid) if state in STOPPED)


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this node (None: none, or not visible)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid
    return None
