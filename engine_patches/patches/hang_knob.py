"""Test knob: plant a host-side hang in the EngineCore's step.

Test knob ``OPSCTL_HANG_STEP=FILE``: while ``FILE`` exists, the EngineCore's step blocks
on a lock in a function named ``planted_hang``, the way an engine stuck in its step looks:
/health still answers 200 (the API server is fine), no step runs, the gauges stay where
they were, queued requests wait for ever. Removing the file lets the step go on.

One data-parallel engine (issue 44): while ``FILE.dp<N>`` exists, only the EngineCore of
data-parallel rank N blocks (the others go on serving), the way one engine of a DP
server hangs among healthy ones. The rank is read from the EngineCore's own
``vllm_config.parallel_config`` at call time: ``data_parallel_index``, since vLLM 0.32
reconfigures a non-MoE DP engine as an independent one (``data_parallel_rank`` 0,
``data_parallel_size`` 1, ``reconfigure_for_independent_dp_rank``) and keeps the
original rank only there; ``data_parallel_rank`` where the index is missing.

For the hang tests of issue 35 (the canary, ``opsctl stacks`` naming the frame). Inert
unless the knob is set through opsctl's knob mechanism (``engine_patches.knobs``: never
from an inherited environment); the ledger shows it (``test_knobs``).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from engine_patches import knobs
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe
from engine_patches.wrapping import Originals

ORIGINALS = Originals()
MARK = "_opsctl_hang_knob"
CORE = "vllm.v1.engine.core"
INERT = Outcome(SKIPPED, "test knob not set (inert)")  # a hang knob nobody set


def planted_hang(trigger: str) -> None:
    """Block on a lock nobody releases while ``trigger`` exists (checked each 0.2 s)."""
    lock = threading.Lock()
    lock.acquire()
    while os.path.exists(trigger):
        lock.acquire(timeout=0.2)


def hang_while(trigger: str, hang: Callable[[str], None]) -> Callable[[Any], Any]:
    """A method wrapper that first runs ``hang`` while the file ``trigger`` exists.

    ``hang`` returns once the file is gone; then the method runs."""

    def wrap(original):
        @functools.wraps(original)
        def hung(self, *args, **kwargs):
            if os.path.exists(trigger):
                hang(trigger)
            return original(self, *args, **kwargs)

        return hung

    return wrap


def dp_rank(core: Any) -> int | None:
    """The data-parallel rank of an EngineCore, from its own config (None: unknown)."""
    parallel = getattr(getattr(core, "vllm_config", None), "parallel_config", None)
    for name in ("data_parallel_index", "data_parallel_rank"):
        rank = getattr(parallel, name, None)
        if isinstance(rank, int):
            return rank
    return None


def held_by(trigger: str, rank: int | None) -> str | None:
    """The file that holds this engine now; None when none exists.

    ``trigger`` (every engine), else ``trigger.dp<rank>`` (this engine alone)."""
    if os.path.exists(trigger):
        return trigger
    mine = f"{trigger}.dp{rank}" if rank is not None else None
    return mine if mine is not None and os.path.exists(mine) else None


def hang_engine_while(trigger: str, hang: Callable[[str], None]) -> Callable[[Any], Any]:
    """:func:`hang_while` for an EngineCore method, with the per-rank file too.

    While ``trigger`` exists every engine blocks; while ``trigger.dp<N>`` exists only
    the engine of data-parallel rank N (read from ``self`` at each call)."""

    def wrap(original):
        @functools.wraps(original)
        def hung(self, *args, **kwargs):
            held = held_by(trigger, dp_rank(self))
            if held is not None:
                hang(held)
            return original(self, *args, **kwargs)

        return hung

    return wrap


def apply() -> Outcome:
    """Make the EngineCore's step block while the knob's file exists.

    ``step`` and ``step_with_batch_queue``; the file blocks every engine,
    ``FILE.dp<N>`` the engine of DP rank N. Skipped when the knob is not set."""
    trigger = knobs.get(knobs.HANG_STEP)
    if not trigger:
        return INERT
    from vllm.v1.engine import core

    cls = core.EngineCore
    wrapped = []
    for name in ("step", "step_with_batch_queue"):
        wrapper = hang_engine_while(trigger, planted_hang)
        if name in vars(cls) and ORIGINALS.wrap(cls, name, wrapper, MARK):
            wrapped.append(name)
    return Outcome(
        APPLIED,
        f"EngineCore.{'/'.join(wrapped) or 'step'} blocks while {trigger} exists "
        f"(the engine of DP rank N alone while {trigger}.dpN exists)",
    )


PATCH = probe(
    "hang_knob",
    reason="test knob: plant an engine hang with /health 200 (issue 35)",
    apply=apply,
    roles=("engine_core",),
    symbols=(f"{CORE}:EngineCore.step",),
)
