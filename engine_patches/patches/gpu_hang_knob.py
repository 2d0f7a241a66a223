"""Test knob: plant a GPU-side hang (a spinning kernel) in the worker's model step.

Test knob ``OPSCTL_HANG_GPU=FILE``: while ``FILE`` exists, the worker's model step keeps
the device busy with a kernel that spins (torch's ``cuda._sleep``, about a second per
launch, launched again until ``FILE`` is gone) and waits for it in a function named
``planted_gpu_hang``: the way an engine stuck in a kernel or a collective that never
finishes looks. /health still answers 200, no step completes, the GPU reads 100 % busy.
On a machine without CUDA the knob blocks the step without a device (host side), and
says so in its outcome.

For issue 35's GPU signature (a stall with the GPU busy, told apart from a host-side
hang, ``hang_knob``, which leaves the GPU idle). Inert unless the knob is set through
opsctl's knob mechanism (``engine_patches.knobs``: never from an inherited environment).
"""

from __future__ import annotations

import os

from engine_patches import knobs
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe
from engine_patches.patches.hang_knob import INERT, hang_while, planted_hang
from engine_patches.wrapping import Originals

ORIGINALS = Originals()
MARK = "_opsctl_gpu_hang_knob"
WORKER = "vllm.v1.worker.gpu_worker"
SPIN_CYCLES = 2_000_000_000  # ~1 s at an H200's 1.98 GHz SM clock: one launch


def planted_gpu_hang(trigger: str) -> None:
    """Spin the GPU while ``trigger`` exists (block on the host without CUDA).

    Keep the device busy with spinning kernels while ``trigger`` exists, waiting for
    each in the current stream (a host thread blocked in a CUDA synchronisation)."""
    import torch

    if not torch.cuda.is_available():  # no device: hold the step as hang_knob does
        planted_hang(trigger)
        return
    stream = torch.cuda.current_stream()
    while os.path.exists(trigger):
        torch.cuda._sleep(SPIN_CYCLES)
        stream.synchronize()


def apply() -> Outcome:
    """Make ``Worker.execute_model`` hang while the knob's file exists.

    It spins the GPU (without CUDA: it blocks); skipped when the knob is not set."""
    trigger = knobs.get(knobs.HANG_GPU)
    if not trigger:
        return INERT
    from vllm.v1.worker import gpu_worker

    cls = gpu_worker.Worker
    if "execute_model" not in vars(cls):
        return Outcome(SKIPPED, "Worker.execute_model not found")
    ORIGINALS.wrap(cls, "execute_model", hang_while(trigger, planted_gpu_hang), MARK)
    import torch

    how = "spins the GPU" if torch.cuda.is_available() else "blocks (no CUDA device here)"
    return Outcome(APPLIED, f"Worker.execute_model {how} while {trigger} exists")


PATCH = probe(
    "gpu_hang_knob",
    reason="test knob: plant a GPU-side hang (a spinning kernel) with /health 200 (issue 35)",
    apply=apply,
    roles=("engine_core", "worker"),
    verified_on=("0.26.0", "0.32.0"),
    symbols=(f"{WORKER}:Worker.execute_model",),
)
