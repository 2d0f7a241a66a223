"""The ranks of one vLLM server (pure): process titles -> roles, layouts, CPU binding.

vLLM names its processes with ``setproctitle`` (``VLLM::EngineCore_DP1``,
``VLLM::Worker_TP1``, ``VLLM::Worker_DP0_PP1_TP0``, ``VLLM::DPCoordinator``,
``VLLM::APIServer_2``; the prefix is ``VLLM_PROCESS_NAME_PREFIX``). A role is that title
without the prefix, so an operator reads the same name in ``ps``, in vLLM's log prefixes
(``(EngineCore_DP1 pid=N)``) and in opsctl. One correction: vLLM 0.32 titles the worker
of a data-parallel engine without TP/PP plain ``Worker``; its DP rank is its parent
EngineCore's, so :func:`roles` names it ``Worker_DP1``.

A single-rank server keeps the plain names (``EngineCore``, ``Worker``, ``APIServer``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

_T = TypeVar("_T")

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore"
WORKER = "Worker"
COORDINATOR = "DPCoordinator"
KINDS = (API_SERVER, COORDINATOR, ENGINE_CORE, WORKER)
# the rank axes vLLM puts in a title, in its order (multiproc_executor.py)
AXES = ("DP", "PP", "PCP", "TP", "DCP", "EP")

_TITLE = re.compile(r"(?:^|\s|::)(APIServer|DPCoordinator|EngineCore|Worker)((?:_[A-Z]*\d+)*)\b")
_AXIS = re.compile(r"_([A-Z]+)(\d+)")


@dataclass(frozen=True, slots=True)
class RankId:
    """One process's place in the server: its kind and its rank on each axis."""

    kind: str  # one of KINDS
    ranks: tuple[tuple[str, int], ...] = ()  # (axis, rank) in AXES order
    index: int | None = None  # APIServer_N (several API servers)

    def get(self, axis: str) -> int | None:
        """This process's rank on ``axis`` (DP, TP, PP, ...); None when it has none."""
        return dict(self.ranks).get(axis)

    @property
    def role(self) -> str:
        """The role as vLLM titles it, without the prefix: ``Worker_DP1_TP0``."""
        if self.kind == API_SERVER and self.index is not None:
            return f"{API_SERVER}_{self.index}"
        return self.kind + "".join(f"_{a}{r}" for a, r in self.ranks)


def parse_title(text: str) -> RankId | None:
    """The :class:`RankId` named by a process title or command line; None for others."""
    m = _TITLE.search(text)
    if not m:
        return None
    kind, tail = m.group(1), m.group(2)
    if kind == API_SERVER:
        num = re.fullmatch(r"_(\d+)", tail or "")
        return RankId(kind, (), int(num.group(1)) if num else None)
    found = {a: int(r) for a, r in _AXIS.findall(tail or "") if a in AXES}
    return RankId(kind, tuple((a, found[a]) for a in AXES if a in found))


def with_dp(rank: RankId, dp: int | None) -> RankId:
    """``rank`` placed in data-parallel engine ``dp`` (unchanged when it has a DP rank)."""
    if dp is None or rank.get("DP") is not None:
        return rank
    return RankId(rank.kind, (("DP", dp), *rank.ranks), rank.index)


@dataclass(frozen=True, slots=True)
class Member:
    """One process of a server's tree as a collector read it."""

    pid: int
    ppid: int
    title: str  # the command line (vLLM's process title), or the name
    is_root: bool = False


def rank_ids(members: Sequence[Member]) -> dict[int, RankId | None]:
    """Every member's :class:`RankId` (None: not a vLLM role), DP inherited from parents.

    The root with no title of its own is the API server."""
    parsed = {m.pid: parse_title(m.title) for m in members}
    for m in members:
        if parsed[m.pid] is None and m.is_root:
            parsed[m.pid] = RankId(API_SERVER)
    parent = {m.pid: m.ppid for m in members}
    out: dict[int, RankId | None] = {}
    for m in members:
        rank = parsed[m.pid]
        if rank is not None and rank.kind == WORKER and rank.get("DP") is None:
            up, seen = parent.get(m.pid), 0
            while up in parsed and seen < 8:
                above = parsed[up]
                if above is not None and above.kind == ENGINE_CORE:
                    rank = with_dp(rank, above.get("DP"))
                    break
                up, seen = parent.get(up), seen + 1
        out[m.pid] = rank
    return out


def record_roles(records: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """pid -> rank role of engine_patches' ledger records (one per vLLM process).

    From each record's ``title`` (vLLM's, rewritten once vLLM set it), a DP engine's
    plain ``Worker`` placed by its parent record; the ``api_server`` record is the
    APIServer. Records without a title (older ledgers) get none."""
    members = []
    for r in records:
        try:
            pid, ppid = int(r.get("pid") or 0), int(r.get("ppid") or 0)
        except (TypeError, ValueError):
            continue
        if not pid or r.get("role") == "model_inspector":
            continue
        api = r.get("role") == "api_server"
        members.append(Member(pid, ppid, "" if api else str(r.get("title") or ""), is_root=api))
    return {pid: rank.role for pid, rank in rank_ids(members).items() if rank is not None}


def by_rank(items: Iterable[_T], role: Callable[[_T], str]) -> list[_T]:
    """``items`` in rank order (:func:`order_key` of each one's role), stable."""
    return sorted(items, key=lambda item: order_key(role(item)))


def tree_order(
    items: Iterable[_T],
    root: int,
    pid: Callable[[_T], int],
    ppid: Callable[[_T], int],
    role: Callable[[_T], str],
) -> list[_T]:
    """``items`` (processes) depth first from ``root``, siblings in rank order.

    A parent comes before its children; a process whose parent is not among ``items``
    comes after the root's tree, in rank order."""
    items = list(items)
    kids: dict[int, list[_T]] = {}
    for item in items:
        kids.setdefault(ppid(item), []).append(item)
    out: list[_T] = []
    seen: set[int] = set()
    stack = by_rank([i for i in items if pid(i) == root], role)
    stack += [i for i in by_rank(items, role) if pid(i) != root]
    stack.reverse()
    while stack:
        item = stack.pop()
        if pid(item) in seen:
            continue
        seen.add(pid(item))
        out.append(item)
        stack.extend(reversed(by_rank(kids.get(pid(item), []), role)))
    return out


def order_key(role: str) -> tuple:
    """Sort key for roles: API server, coordinator, then each engine and its workers."""
    rank = parse_title(role)
    if rank is None:
        return (9, role)
    kinds = {API_SERVER: 0, COORDINATOR: 1, ENGINE_CORE: 2, WORKER: 2}
    dp = rank.get("DP") or 0
    sub = 0 if rank.kind == ENGINE_CORE else 1
    rest = tuple(rank.get(a) or 0 for a in AXES[1:])
    return (kinds[rank.kind], dp, sub, rest, rank.index or 0)


def engine_of(role: str) -> int | None:
    """The data-parallel engine (``engine`` label) a role belongs to; None: not one's."""
    rank = parse_title(role)
    if rank is None or rank.kind not in (ENGINE_CORE, WORKER):
        return None
    return rank.get("DP") or 0


# ---- the layout an operator asks for ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """Tensor-, pipeline- and data-parallel sizes of one server."""

    tp: int = 1
    dp: int = 1
    pp: int = 1

    @property
    def world(self) -> int:
        """Model ranks (worker processes that compute) on this node."""
        return self.tp * self.dp * self.pp

    @property
    def single(self) -> bool:
        """One rank: vLLM's default layout."""
        return self.world == 1

    def describe(self) -> str:
        """``TP=2 x DP=1`` (PP only when set)."""
        pp = f" x PP={self.pp}" if self.pp > 1 else ""
        return f"TP={self.tp} x DP={self.dp}{pp}"


def cpu_binding(cpus: Iterable[int], layout: Layout) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``layout`` over the CPUs this process may use.

    One contiguous share per local rank, in vLLM's rank order (DP, PP, TP; see
    ``vllm/utils/ompmultiprocessing.py``), the remainder to the last ranks. ValueError when
    there are fewer CPUs than ranks."""
    pool = sorted(set(cpus))
    world = layout.world
    if len(pool) < world:
        raise ValueError(
            f"{layout.describe()} needs {world} CPUs (one per rank) and this process may use "
            f"{len(pool)} ({compact(pool)})"
        )
    base, extra = divmod(len(pool), world)
    shares, at = [], 0
    for i in range(world):
        n = base + (1 if i >= world - extra else 0)
        shares.append(compact(pool[at : at + n]))
        at += n
    return "|".join(shares)


def compact(ids: Sequence[int]) -> str:
    """CPU ids as vLLM parses them: ``0-3,6``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
