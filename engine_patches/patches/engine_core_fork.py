"""Fast start for opsctl's check engines on CPU: the API server forks its EngineCore.

vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in
``CpuPlatform.check_and_update_config``, so the EngineCore (and, in vLLM's default
layout, its Worker) starts a fresh interpreter and imports vLLM again: about 8 s per
process on 2 cores, the largest share of a tiny model's start. On one GPU vLLM forks its
EngineCore (``fork`` is its default unless CUDA is already initialised in the API
server); this patch does the same on CPU, for engines opsctl starts for its checks.

Applied in the API server only, and only when opsctl asked for it (``OPSCTL_ENGINE_FORK=1``,
which opsctl sets for a check engine in the single-process layout: the model runs inside
the EngineCore, vLLM's uni executor, so no Worker process is started after the fork and
no OpenMP pool exists in the API server to be inherited). ``opsctl serve`` never sets it.
Elsewhere (another platform, a vLLM without the target) it is skipped with the reason.

A forked EngineCore inherits the API server's loaded plugins: ``engine_patches.register``
re-arms vLLM's plugin loading in the child (``os.register_at_fork``), so the EngineCore
applies its own patches and writes its own ledger as a spawned one does.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from engine_patches.patch import APPLIED, SKIPPED, Outcome, declare, symbols

ENV = "OPSCTL_ENGINE_FORK"
ORIGINALS: dict[str, Any] = {}


def requested(env: dict[str, str] | None = None) -> bool:
    """Whether opsctl asked for a forked EngineCore (``OPSCTL_ENGINE_FORK=1``)."""
    return (env if env is not None else os.environ).get(ENV) == "1"


def apply() -> Outcome:
    """Make the CPU platform choose ``fork`` for a uni-executor engine, when asked."""
    if not requested():
        return Outcome(SKIPPED, f"not requested ({ENV} unset: vLLM's own start method)")
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return Outcome(SKIPPED, "not a CPU platform: vLLM chooses its own start method")
    from vllm.platforms import cpu

    cls = cpu.CpuPlatform
    current = cls.__dict__["check_and_update_config"]
    if getattr(current.__func__, "_opsctl_fork", False):
        return Outcome(APPLIED, "already applied in this process")
    original = current.__func__
    ORIGINALS["check_and_update_config"] = current

    @functools.wraps(original)
    def check_and_update_config(klass, vllm_config):
        original(klass, vllm_config)
        if vllm_config.parallel_config.distributed_executor_backend == "uni":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    check_and_update_config._opsctl_fork = True  # type: ignore[attr-defined]
    cls.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    return Outcome(APPLIED, "the EngineCore is forked from the API server (uni executor only)")


def revert() -> None:
    """Undo (tests): the platform's own method again."""
    if "check_and_update_config" in ORIGINALS:
        from vllm.platforms import cpu

        cpu.CpuPlatform.check_and_update_config = ORIGINALS.pop(  # type: ignore[method-assign]
            "check_and_update_config"
        )


PATCH = declare(
    "engine_core_fork",
    versions="any",
    reason="opsctl fast start: fork the EngineCore on CPU as vLLM does on one GPU",
    apply=apply,
    roles=("api_server",),
    verified_on=("0.32.0",),
    symbols=symbols("vllm.platforms.cpu", "CpuPlatform.check_and_update_config"),
)
