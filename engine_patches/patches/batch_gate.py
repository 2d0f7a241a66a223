"""Probe: gather a group of requests in the engine core, so they are scheduled together.

A check that must run requests *in one batch* (``diag lora``'s mixed batch, invariance's
BS=N side) cannot get that from the client: the API server hands requests to the engine
one after another, and on a busy machine the first ones can finish before the last ones
arrive (measured under a CPU hog: 6 sends of 6 requests, never all in shared steps).

Inert unless ``OPSCTL_PROBES`` (comma-separated) contains ``gate``. Then it wraps
``EngineCore.add_request``: a request whose id contains a gather marker
(:func:`marker`, ``opsctl-gather<N>x<group>``) is held back until all ``N`` requests of
its group have arrived, and then all of them are added to the scheduler at once, in
arrival order, before the next schedule. Requests without a marker are never touched,
nor is an in-process engine core (no input queue to hand a timed-out group back to).

A group that does not fill within ``HOLD_S`` (a request rejected by the API server, a
client that gave up) is released as it is: a timer puts the held requests back on the
engine core's input queue (the only thread-safe way in), so the engine never waits on
a client; its late members then pass at once. A held request that is aborted is
dropped (also when the abort comes while the timer hands it back). At shutdown every
held request goes to the scheduler, which drains or aborts it like any other.

A pause (``EngineCoreProc.pause_scheduler``, which vLLM's ``pause_generation`` calls)
first hands every held request to the scheduler, so the pause treats it like any request
accepted before it (abort: aborted and answered; wait: drained; keep: kept); a request
the timer hands back while vLLM >= 0.33 rejects new work during a pause
(``_reject_add_while_paused``) is let through, since it was accepted before.

Limits: held requests are not counted in the scheduler's waiting figures (for at most
``HOLD_S``); with data parallelism each engine core has its own gate, so a group
spread over ranks is released on timeout, not gathered. Every hold and release is
appended to ``<run>/events/gate.jsonl`` (``{"event": "released", "group", "size",
"count", "waited_s", "why": "complete" | "timeout" | "shutdown" | "pause",
"req_ids"}``), so a report can say the batch was gathered by the engine.
"""

from __future__ import annotations

import functools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine_patches import wrapping
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe, symbols
from engine_patches.records import record_event
from engine_patches.wrapping import Originals

PROBE = "gate"
HOLD_S = 30.0
MAX_SIZE = 256
_MARK = re.compile(r"opsctl-gather(\d+)x([0-9a-f]{4,32})")
ORIGINALS = Originals()
MARK = "_opsctl_gate"  # on our wrappers; on an engine core, its Gate


def requested(env: dict[str, str] | None = None) -> bool:
    """Whether ``OPSCTL_PROBES`` names this probe."""
    return wrapping.requested(PROBE, env)


def marker(size: int, group: str | None = None) -> str:
    """The text a request id carries to be gathered with ``size - 1`` others."""
    if not 1 <= size <= MAX_SIZE:
        raise ValueError(f"gather group size must be 1..{MAX_SIZE}, not {size}")
    return f"opsctl-gather{size}x{group or uuid.uuid4().hex[:12]}"


def parse(request_id: str) -> tuple[str, int] | None:
    """(group, size) of a marked request id; None for any other id."""
    m = _MARK.search(request_id)
    if m is None or not 1 <= int(m[1]) <= MAX_SIZE:
        return None
    return m[0], int(m[1])


@dataclass
class _Group:
    size: int
    started: float
    held: list[tuple[Any, int]] = field(default_factory=list)  # (Request, wave)


class Gate:
    """The request groups one engine core holds back until each is complete.

    Held groups of one engine core. ``add`` and ``abort`` run on the core's busy
    loop; the timer only puts items on the core's (thread-safe) input queue."""

    def __init__(self, requeue, hold_s: float = HOLD_S) -> None:
        self.requeue = requeue  # (request, wave) -> None, from any thread
        self.hold_s = hold_s
        self.groups: dict[str, _Group] = {}
        self.released: set[str] = set()  # request ids the timer handed back
        self.dropped: set[str] = set()  # handed back, then aborted before re-added
        self.expired: set[str] = set()  # groups released on timeout: late members pass
        self.lock = threading.Lock()

    def add(self, request: Any, wave: int) -> list[tuple[Any, int]]:
        """What to add to the scheduler now (possibly nothing, possibly a whole group)."""
        rid = str(request.request_id)
        with self.lock:
            if rid in self.dropped:
                self.dropped.discard(rid)
                return []
            if rid in self.released:
                self.released.discard(rid)
                return [(request, wave)]
        found = parse(rid)
        if found is None:
            return [(request, wave)]
        key, size = found
        with self.lock:
            if key in self.expired:
                return [(request, wave)]
            group = self.groups.setdefault(key, _Group(size, time.monotonic()))
            group.held.append((request, wave))
            if len(group.held) < size:
                if len(group.held) == 1:
                    timer = threading.Timer(self.hold_s, self._expire, args=(key,))
                    timer.daemon = True
                    timer.start()
                return []
            del self.groups[key]
        self._record(key, group, "complete")
        return group.held

    def _expire(self, key: str) -> None:
        with self.lock:
            group = self.groups.pop(key, None)
            if group is None:
                return
            self.expired.add(key)
            self.released.update(str(r.request_id) for r, _ in group.held)
        self._record(key, group, "timeout")
        for request, wave in group.held:
            self.requeue(request, wave)

    def abort(self, request_ids) -> None:
        """Forget the aborted requests among those held or on their way back."""
        gone = {str(r) for r in request_ids or ()}
        with self.lock:
            self.dropped |= gone & self.released  # still on its way back through the queue
            self.released -= gone
            for key, group in list(self.groups.items()):
                group.held = [(r, w) for r, w in group.held if str(r.request_id) not in gone]
                if not group.held:
                    del self.groups[key]

    def flush(self, why: str = "shutdown") -> list[tuple[Any, int]]:
        """Hand back every held request, in arrival order per group.

        At shutdown or a pause: the scheduler then drains, keeps or aborts them like any
        other accepted request. Late members of a flushed group pass at once."""
        with self.lock:
            groups, self.groups = self.groups, {}
            self.expired.update(groups)
        for key, group in groups.items():
            self._record(key, group, why)
        return [held for group in groups.values() for held in group.held]

    def accepted(self, request_id: str) -> bool:
        """Whether the gate held a request and handed it back.

        Such a request was accepted before any pause that rejects new work now."""
        with self.lock:
            return str(request_id) in self.released

    @staticmethod
    def _record(key: str, group: _Group, why: str) -> None:
        record_event(
            PROBE,
            {
                "event": "released",
                "group": key,
                "size": group.size,
                "count": len(group.held),
                "waited_s": round(time.monotonic() - group.started, 3),
                "why": why,
                "req_ids": [str(r.request_id) for r, _ in group.held],
            },
        )


def _gate_of(core) -> Gate:
    gate = getattr(core, "_opsctl_gate", None)
    if gate is None:
        from vllm.v1.engine import EngineCoreRequestType

        def requeue(request, wave, q=core.input_queue):
            q.put_nowait((EngineCoreRequestType.ADD, (request, wave)))

        gate = core._opsctl_gate = Gate(requeue)
    return gate


def _wrap_add(original):
    @functools.wraps(original)
    def add_request(self, request, request_wave: int = 0):
        if getattr(self, "input_queue", None) is None:  # in-process core: nothing to
            return original(self, request, request_wave)  # hand a timed-out group back to
        try:
            ready = _gate_of(self).add(request, request_wave)
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "error": repr(exc)})
            ready = [(request, request_wave)]
        for req, wave in ready:
            original(self, req, wave)

    return add_request


def _wrap_abort(original):
    @functools.wraps(original)
    def abort_requests(self, request_ids):
        try:
            if getattr(self, "_opsctl_gate", None) is not None:
                self._opsctl_gate.abort(request_ids)
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "error": repr(exc)})
        return original(self, request_ids)

    return abort_requests


def _wrap_shutdown(original):
    """Once a shutdown is requested, hand every held request to the scheduler first,
    so the engine drains or aborts it (and answers its client) instead of losing it."""

    @functools.wraps(original)
    def _handle_shutdown(self):
        gate = getattr(self, "_opsctl_gate", None)
        if gate is not None and gate.groups and not self.is_running():
            add = ORIGINALS.original("add_request")
            try:
                for req, wave in gate.flush():
                    add(self, req, wave)
            except Exception as exc:  # a probe never breaks the engine
                record_event(PROBE, {"event": "error", "where": "shutdown", "error": repr(exc)})
        return original(self)

    return _handle_shutdown


def _wrap_pause(original):
    """vLLM >= 0.33 rejects new ADDs during a user pause, and every pause mode acts on
    the scheduler's requests only: before the pause, hand every held request to the
    scheduler, so "abort" aborts it (its client is answered), "wait" drains it and
    "keep" keeps it, like any request accepted before the pause."""

    @functools.wraps(original)
    def pause_scheduler(self, *args, **kwargs):
        gate = getattr(self, "_opsctl_gate", None)
        if gate is not None and gate.groups:
            add = ORIGINALS.original("add_request")
            try:
                for req, wave in gate.flush("pause"):
                    add(self, req, wave)
            except Exception as exc:  # a probe never breaks the engine
                record_event(PROBE, {"event": "error", "where": "pause", "error": repr(exc)})
        return original(self, *args, **kwargs)

    return pause_scheduler


def _wrap_reject_paused(original):
    """A held request the timer hands back through the input queue was accepted before
    any pause: vLLM >= 0.33's ``_reject_add_while_paused`` must not take it for new
    work (it would fail it with a retryable "engine_paused" error)."""

    @functools.wraps(original)
    def _reject_add_while_paused(self, request):
        gate = getattr(self, "_opsctl_gate", None)
        try:
            if gate is not None and gate.accepted(str(request.request_id)):
                return False
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "where": "paused", "error": repr(exc)})
        return original(self, request)

    return _reject_add_while_paused


def install(core_cls, proc_cls) -> list[str]:
    """Wrap the engine core's methods that this vLLM has; the names wrapped.

    ``proc_cls`` may lack the pause methods: vLLM 0.32 has no
    ``_reject_add_while_paused``."""
    done = []
    for owner, attr, wrap in (
        (core_cls, "add_request", _wrap_add),
        (core_cls, "abort_requests", _wrap_abort),
        (proc_cls, "_handle_shutdown", _wrap_shutdown),
        (proc_cls, "pause_scheduler", _wrap_pause),
        (proc_cls, "_reject_add_while_paused", _wrap_reject_paused),
    ):
        if getattr(owner, attr, None) is not None:
            ORIGINALS.wrap(owner, attr, wrap, MARK)
            done.append(attr)
    return done


def apply() -> Outcome:
    """Wrap the engine core's request intake, when the probe is requested."""
    if not requested():
        return Outcome(SKIPPED, f"inert: OPSCTL_PROBES does not contain {PROBE!r}")
    from vllm.v1.engine import core

    done = install(core.EngineCore, core.EngineCoreProc)
    pause = "; held requests join the scheduler before a pause" if "pause_scheduler" in done else ""
    return Outcome(
        APPLIED,
        f"holds requests marked opsctl-gather<N>x<group> until all N arrived (at most "
        f"{HOLD_S:.0f} s), records releases in events/gate.jsonl{pause}",
    )


def undo() -> None:
    """Restore the wrapped methods (tests)."""
    ORIGINALS.restore()


PATCH = probe(
    "batch_gate",
    target="vllm.v1.engine.core.EngineCore.add_request, .abort_requests, "
    "EngineCoreProc._handle_shutdown, .pause_scheduler, ._reject_add_while_paused (>= 0.33)",
    versions="0.32 (EngineCore.add_request(request, request_wave), input_queue of "
    "(EngineCoreRequestType, payload))",
    reason="opsctl probe for diag lora and invariance: requests meant to be batched "
    "together reach the scheduler together (PR 55897, PR 56528)",
    apply=apply,
    roles=("engine_core",),
    symbols=symbols(
        "vllm.v1.engine.core",
        "EngineCore.add_request",
        "EngineCore.abort_requests",
        "EngineCoreProc._handle_shutdown",
        "EngineCoreProc.pause_scheduler",
    ),
    watch=symbols(
        "vllm.v1.engine.core",
        "EngineCoreProc._handle_client_request",
        "EngineCoreProc._reject_add_while_paused",
    ),
)
