"""Test knob: plant a host-side hang in the EngineCore's step.

Test knob ``OPSCTL_HANG_STEP=FILE``: while ``FILE`` exists, the EngineCore's step blocks
on a lock in a function named ``planted_hang``, the way an engine stuck in its step looks:
/health still answers 200 (the API server is fine), no step runs, the gauges stay where
they were, queued requests wait for ever. Removing the file lets the step go on.

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

    A wrapper of a method that, while ``trigger`` exists, first runs ``hang`` (which
    returns once the file is gone), then the method."""

    def wrap(original):
        @functools.wraps(original)
        def hung(self, *args, **kwargs):
            if os.path.exists(trigger):
                hang(trigger)
            return original(self, *args, **kwargs)

        return hung

    return wrap


def apply() -> Outcome:
    """Make the EngineCore's step block while the knob's file exists.

    Make ``EngineCore.step`` (and ``step_with_batch_queue``) block while the knob's
    file exists; skipped when the knob is not set."""
    trigger = knobs.get(knobs.HANG_STEP)
    if not trigger:
        return INERT
    from vllm.v1.engine import core

    cls = core.EngineCore
    wrapped = []
    for name in ("step", "step_with_batch_queue"):
        if name in vars(cls) and ORIGINALS.wrap(cls, name, hang_while(trigger, planted_hang), MARK):
            wrapped.append(name)
    return Outcome(
        APPLIED, f"EngineCore.{'/'.join(wrapped) or 'step'} blocks while {trigger} exists"
    )


PATCH = probe(
    "hang_knob",
    reason="test knob: plant an engine hang with /health 200 (issue 35)",
    apply=apply,
    roles=("engine_core",),
    symbols=(f"{CORE}:EngineCore.step",),
)
