"""Test knob ``OPSCTL_HANG_STEP=FILE``: while ``FILE`` exists, the EngineCore's step blocks
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
from typing import Any

from engine_patches import knobs
from engine_patches.registry import APPLIED, SKIPPED, Outcome, Patch

ORIGINALS: dict[str, Any] = {}
MARK = "_opsctl_hang_knob"
CORE = "vllm.v1.engine.core"


def planted_hang(trigger: str) -> None:
    """Block on a lock nobody releases while ``trigger`` exists (checked each 0.2 s)."""
    lock = threading.Lock()
    lock.acquire()
    while os.path.exists(trigger):
        lock.acquire(timeout=0.2)


def _wrap(original, trigger: str):
    @functools.wraps(original)
    def step(self, *args, **kwargs):
        if os.path.exists(trigger):
            planted_hang(trigger)
        return original(self, *args, **kwargs)

    setattr(step, MARK, True)
    return step


def apply() -> Outcome:
    trigger = knobs.get(knobs.HANG_STEP)
    if not trigger:
        return Outcome(SKIPPED, "test knob not set (inert)")
    from vllm.v1.engine import core

    cls = core.EngineCore
    wrapped = []
    for name in ("step", "step_with_batch_queue"):
        fn = cls.__dict__.get(name)
        if fn is None or getattr(fn, MARK, False):
            continue
        ORIGINALS[name] = fn
        setattr(cls, name, _wrap(fn, trigger))
        wrapped.append(name)
    return Outcome(
        APPLIED, f"EngineCore.{'/'.join(wrapped) or 'step'} blocks while {trigger} exists"
    )


PATCH = Patch(
    name="hang_knob",
    target="vllm.v1.engine.core.EngineCore.step",
    versions="any",
    reason="test knob: plant an engine hang with /health 200 (issue 35)",
    apply=apply,
    roles=("engine_core",),
    verified_on=("0.32.0",),
    symbols=(f"{CORE}:EngineCore.step",),
    kind="probe",
)
