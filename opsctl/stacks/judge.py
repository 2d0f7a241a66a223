"""Stacks of a vLLM server's processes (``opsctl stacks``), pure: parse, group, judge.

Parsing reads what faulthandler or py-spy gave; grouping joins identical stacks across
processes; judging says in one line per process where it waits. No I/O.

A frame is (function, file, line); a thread's frames go innermost first, as both tools
print them. The line names the main thread's innermost frame that is not in the
standard library's plumbing (threading, selectors, queue, multiprocessing connection,
socket), with the plumbing frame it sits in: ``waits in EngineCoreProc.run_busy_loop
(vllm/v1/engine/core.py:912) via queue.get``. A thread inside a collective (vLLM's
device communicators, ``GroupCoordinator``, ``torch.distributed``) is named by the
collective and the frame that called it: ``waits in all_reduce (.../cpu_communicator.py:275)
(collective) under forward (.../vocab_parallel_embedding.py:562)``.

The verdict over all processes (which rank is stuck, which wait for it) is
:mod:`opsctl.stacks.judge_verdict`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opsctl.domain.records import record

SCHEMA = "stacks/2"  # opsctl.output.document adds "opsctl."

_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[([^\]]*)\])? \(most recent call first\):"
)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.+)$')
_PLUMBING = (
    "/threading.py",
    "/selectors.py",
    "/queue.py",
    "/multiprocessing/connection.py",
    "/multiprocessing/synchronize.py",
    "/socket.py",
    "/asyncio/",
    "/concurrent/futures/",
    "/zmq/",
    "/torch/cuda/",  # a synchronisation: the frame that called it is the one to name
    "/torch/distributed/",  # a collective: likewise
    "/torch/_ops.py",  # an op's dispatch: the frame that called the op is the one to name
)
# where a collective runs: vLLM's communicators and group coordinator, torch.distributed
_COLLECTIVE = (
    "/distributed/device_communicators/",
    "/distributed/parallel_state.py",
    "/distributed/communication_op.py",
    "/torch/distributed/",
)
# vLLM's message queues live beside the communicators but are how work arrives, not collectives
_NOT_COLLECTIVE = ("shm_broadcast.py", "shm_object_storage.py")
# decorators' wrappers between a collective and its caller, e.g. torch's deprecated
# ``_all_gather_base`` (typing_extensions' ``deprecated``): the caller is the frame past them
_WRAPPER = ("/typing_extensions.py", "/functools.py", "/contextlib.py", "/warnings.py")
_DISPATCH = ("/torch/_ops.py", "/torch/_library/")  # an op's dispatch above its caller


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame: function, file and line."""

    func: str
    file: str
    line: int

    def short(self) -> str:
        """``func (pkg/module.py:line)``, the path cut to its site-packages-relative part."""
        path = self.file.split("site-packages/")[-1]
        return f"{self.func} ({path}:{self.line})"

    def to_dict(self) -> dict:
        """The frame as the report holds it."""
        return record(self)


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread's stack, innermost frame first."""

    ident: str
    frames: tuple[Frame, ...]  # innermost first
    current: bool = False  # faulthandler's "Current thread": the one that handled the signal
    name: str | None = None

    def key(self) -> tuple:
        """The thread's frames as a hashable key (identical stacks group by it)."""
        return tuple((f.func, f.file, f.line) for f in self.frames)

    def to_dict(self) -> dict:
        """The thread as the ``stacks`` document holds it."""
        return {
            "ident": self.ident,
            "name": self.name,
            "current": self.current,
            "frames": [f.to_dict() for f in self.frames],
        }


@dataclass(frozen=True, slots=True)
class ProcessStacks:
    """One process's stacks: pid, role, how they were taken, state, or why there are none."""

    pid: int
    role: str
    source: str  # "signal" (faulthandler) | "py-spy" | "none"
    threads: tuple[Thread, ...] = ()
    state: str | None = None  # the process state (running, sleeping, stopped, disk-sleep)
    error: str | None = None  # why there are no stacks
    host: str | None = None  # the host the process runs on (reports of several hosts merge)
    # between two takes: whether the main thread's stack changed (None: one take only)
    moved: bool | None = None
    # whether the main thread slept (kernel state S or D) at both takes: blocked, not computing
    asleep: bool | None = None

    @property
    def main(self) -> Thread | None:
        """The main thread of the process, or None when it has no threads.

        The main thread: named so (py-spy), else the one not started by ``threading``
        (its outermost frame is not ``_bootstrap``; faulthandler's "current thread" is
        whichever thread the signal landed on), else the last listed.
        """
        for t in self.threads:
            if t.name == "MainThread":
                return t
        for t in self.threads:
            if t.frames and not (
                t.frames[-1].func == "_bootstrap" and t.frames[-1].file.endswith("threading.py")
            ):
                return t
        return self.threads[-1] if self.threads else None

    def verdict(self) -> str:
        """One line: where this process waits (or why nothing can be said)."""
        head = f"{self.role} (pid {self.pid})"
        if self.state == "stopped":
            head += " [stopped]"
        if self.error:
            return f"{head}: {self.error}"
        main = self.main
        if main is None or not main.frames:
            return f"{head}: no stack"
        return f"{head}: {where(main.frames)}"

    def to_dict(self) -> dict:
        """The process as the ``stacks`` document holds it, its verdict included."""
        return {
            "pid": self.pid,
            "role": self.role,
            "host": self.host,
            "source": self.source,
            "state": self.state,
            "error": self.error,
            "moved": self.moved,
            "asleep": self.asleep,
            "verdict": self.verdict(),
            "threads": [t.to_dict() for t in self.threads],
        }

    @classmethod
    def from_dict(cls, d: dict, host: str | None = None) -> ProcessStacks:
        """A process of a ``stacks`` document (``host`` when the document names none)."""
        threads = tuple(
            Thread(
                str(t.get("ident")),
                tuple(
                    Frame(str(f["func"]), str(f["file"]), int(f["line"]))
                    for f in t.get("frames") or ()
                ),
                bool(t.get("current")),
                t.get("name"),
            )
            for t in d.get("threads") or ()
        )
        return cls(
            int(d.get("pid") or 0),
            str(d.get("role") or "?"),
            str(d.get("source") or "none"),
            threads,
            d.get("state"),
            d.get("error"),
            d.get("host") or host,
            d.get("moved"),
            d.get("asleep"),
        )


def is_native(f: Frame) -> bool:
    """Whether a frame is a C frame of a native dump (py-spy --native).

    Its file is a shared library, a C
    source or an executable (a statically linked libpython), not Python's ``.py`` nor
    ``<string>``/``<frozen ...>``.
    """
    return not (f.file.endswith((".py", ".pyc")) or f.file.startswith("<") or not f.file)


def where(frames: Sequence[Frame]) -> str:
    """``waits in <first own frame> via <plumbing it sits in>``, innermost first.

    With C frames below (``--native``): ``waits in <first named C function> (<library>) under
    <that Python frame>``, e.g. a CUDA synchronisation under the step that called it. In a
    collective: ``waits in <collective frame> (collective) under <its caller>``.
    """
    inside = collective(frames)
    if inside is not None:
        at, caller = inside
        under = f" under {caller.short()}" if caller is not None else ""
        return f"waits in {at.short()} (collective){under}"
    if frames and is_native(frames[0]):
        named = next((f for f in frames if is_native(f) and not f.func.startswith("0x")), None)
        python = [f for f in frames if not is_native(f)]
        if named is not None:
            lib = named.file.rsplit("/", 1)[-1]
            own = next((f for f in python if not any(p in f.file for p in _PLUMBING)), None)
            top = own or (python[0] if python else None)
            under = f" under {top.short()}" if top is not None else ""
            return f"waits in {named.func} ({lib}){under}"
        frames = python or frames
    plumbing = [f for f in frames if any(p in f.file for p in _PLUMBING)]
    own = next((f for f in frames if not any(p in f.file for p in _PLUMBING)), None)
    if own is None:
        return f"in {frames[0].short()}"
    if plumbing and frames[0] is plumbing[0]:
        module = plumbing[0].file.rsplit("/", 1)[-1].removesuffix(".py")
        return f"waits in {own.short()} via {module}.{plumbing[0].func}"
    return f"in {own.short()}"


def is_collective(f: Frame) -> bool:
    """Whether a frame is inside a collective (all-reduce, all-gather, broadcast...)."""
    return any(p in f.file for p in _COLLECTIVE) and not any(n in f.file for n in _NOT_COLLECTIVE)


def collective(frames: Sequence[Frame]) -> tuple[Frame, Frame | None] | None:
    """(the collective frame a thread waits in, the frame that called the collective).

    None unless the thread's innermost Python frame (past an op's dispatch) is in a
    collective. The collective frame is the innermost one (the communicator's call that
    waits for the other ranks); the caller is the first frame outside the collective code
    and the decorators' wrappers around it (the layer whose forward runs it)."""
    python = [f for f in frames if not is_native(f)]
    i = 0
    while i < len(python) and any(d in python[i].file for d in _DISPATCH):
        i += 1
    if i >= len(python) or not is_collective(python[i]):
        return None
    j = i
    while j + 1 < len(python) and (
        is_collective(python[j + 1]) or any(w in python[j + 1].file for w in _WRAPPER)
    ):
        j += 1
    return python[i], (python[j + 1] if j + 1 < len(python) else None)


def parse_faulthandler(text: str) -> tuple[Thread, ...]:
    """The threads of the last complete dump in ``text`` (a dump file may hold several)."""
    dumps: list[list[Thread]] = [[]]
    ident: str | None = None
    current = False
    frames: list[Frame] = []

    def close() -> None:
        if ident is not None:
            dumps[-1].append(Thread(ident, tuple(frames), current))

    seen_idents: set[str] = set()
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            close()
            new_ident = m.group(2)
            if new_ident in seen_idents:  # the same thread again: a new dump began
                dumps.append([])
                seen_idents = set()
            seen_idents.add(new_ident)
            ident, current, frames = new_ident, m.group(1) == "Current thread", []
            continue
        f = _FRAME.match(line)
        if f and ident is not None:
            frames.append(Frame(f.group("func").strip(), f.group("file"), int(f.group("line"))))
    close()
    return tuple(dumps[-1])


def parse_pyspy(doc: Iterable[dict]) -> tuple[Thread, ...]:
    """py-spy's ``dump --json``: a list of threads with ``frames`` innermost first."""
    out = []
    for t in doc:
        frames = tuple(
            Frame(str(f.get("name")), str(f.get("filename")), int(f.get("line") or 0))
            for f in t.get("frames") or ()
        )
        ident = hex(int(t.get("thread_id") or 0))
        name = t.get("thread_name")
        out.append(Thread(ident, frames, current=False, name=name))
    # py-spy lists the main thread first; faulthandler's order puts it last
    return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class Group:
    """One stack shared by several threads (across processes: identical workers)."""

    frames: tuple[Frame, ...]
    # (pid, role, thread, host)
    members: tuple[tuple[int, str, str, str | None], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """The group as the ``stacks`` document holds it: its members and shared frames."""
        return {
            "members": [
                {"pid": p, "role": r, "thread": t, "host": h} for p, r, t, h in self.members
            ],
            "frames": [f.to_dict() for f in self.frames],
        }


def group(processes: Sequence[ProcessStacks]) -> list[Group]:
    """Identical stacks (every frame equal) grouped, largest group first."""
    by_key: dict[tuple, list[tuple[int, str, str, str | None]]] = {}
    frames_of: dict[tuple, tuple[Frame, ...]] = {}
    for p in processes:
        for t in p.threads:
            k = t.key()
            by_key.setdefault(k, []).append((p.pid, p.role, t.ident, p.host))
            frames_of[k] = t.frames
    groups = [Group(frames_of[k], tuple(m)) for k, m in by_key.items()]
    return sorted(groups, key=lambda g: (-len(g.members), str(g.members[0])))


# where a process of a healthy engine waits between requests: not what a stall is about
IDLE_WAITS = (
    "uvloop/",  # the API server's event loop
    "shm_broadcast.py",  # an EngineCore waiting for its workers, a worker for work
    "_process_input_queue",  # an idle EngineCore waiting for requests
    "resource_tracker.py",
    "worker_busy_loop",
    "monitor_workers",  # a headless node's executor watching its workers (multi-node)
)


def is_idle(line: str) -> bool:
    """Whether a process's line (:meth:`ProcessStacks.verdict`) names an idle engine's wait."""
    return any(w in line for w in IDLE_WAITS)
