"""Test knob: one tensor-parallel rank blocks before a collective, its peers wait in it.

Test knob ``OPSCTL_HANG_RANK=TP<r>:FILE`` (``TP1:/tmp/hold``): while ``FILE`` exists, the
worker of tensor-parallel rank ``r`` blocks inside the model's forward, in the vocabulary
embedding (``VocabParallelEmbedding.forward``, the first layer of every model vLLM
shards) BEFORE that layer's all-reduce, the first tensor-parallel collective of a
forward, in a function named ``planted_hang``. Every other rank runs the same layer,
enters the all-reduce (vLLM's CPU shared-memory all-reduce, or NCCL on a GPU) and waits
there for the missing rank: the way a TP server looks when one rank is stuck (vLLM RFC
#48720). /health still answers 200, no step completes. Removing the file lets the rank
go on and the all-reduce completes.

For issue 44's "rank that hangs" (``opsctl stacks`` names the odd rank and the frame its
peers wait in). Inert unless the knob is set through opsctl's knob mechanism
(``engine_patches.knobs``: never from an inherited environment); the ledger shows it.
"""

from __future__ import annotations

import functools
import os
import re

from engine_patches import knobs
from engine_patches.patch import APPLIED, FAILED, Outcome, probe
from engine_patches.patches.hang_knob import INERT, planted_hang
from engine_patches.wrapping import Originals

ORIGINALS = Originals()
MARK = "_opsctl_rank_hang_knob"
EMBEDDING = "vllm.model_executor.layers.vocab_parallel_embedding"
_VALUE = re.compile(r"^TP(\d+):(.+)$")


def parse(value: str) -> tuple[int, str] | None:
    """``"TP1:/tmp/hold"`` -> ``(1, "/tmp/hold")``; None when the value is not of that form."""
    m = _VALUE.match(value.strip())
    return (int(m.group(1)), m.group(2)) if m else None


def hang_rank(rank: int, trigger: str):
    """A ``forward`` wrapper: on TP rank ``rank``, first block while ``trigger`` exists.

    The wrapped layer's own ``tp_rank`` says which rank runs it; the other ranks go
    straight into the original forward (and its all-reduce)."""

    def wrap(original):
        @functools.wraps(original)
        def forward_before_all_reduce(self, *args, **kwargs):
            if getattr(self, "tp_rank", 0) == rank and os.path.exists(trigger):
                planted_hang(trigger)
            return original(self, *args, **kwargs)

        return forward_before_all_reduce

    return wrap


def apply() -> Outcome:
    """Make TP rank ``r``'s embedding forward block before its all-reduce while FILE exists."""
    value = knobs.get(knobs.HANG_RANK)
    if not value:
        return INERT
    parsed = parse(value)
    if parsed is None:
        return Outcome(FAILED, f"{knobs.HANG_RANK}={value!r}: expected TP<rank>:FILE")
    rank, trigger = parsed
    from vllm.model_executor.layers import vocab_parallel_embedding as emb

    cls = emb.VocabParallelEmbedding
    ORIGINALS.wrap(cls, "forward", hang_rank(rank, trigger), MARK)
    return Outcome(
        APPLIED,
        f"TP rank {rank} blocks in VocabParallelEmbedding.forward before its all-reduce "
        f"while {trigger} exists",
    )


PATCH = probe(
    "rank_hang_knob",
    reason="test knob: one TP rank stuck before a collective, its peers waiting in it (issue 44)",
    apply=apply,
    roles=("worker",),
    symbols=(f"{EMBEDDING}:VocabParallelEmbedding.forward",),
    # the collective the other ranks wait in (CPU: the shared-memory all-reduce)
    watch=(
        "vllm.distributed.parallel_state:GroupCoordinator.all_reduce",
        "vllm.distributed.device_communicators.cpu_communicator:CpuCommunicator.all_reduce",
    ),
)
