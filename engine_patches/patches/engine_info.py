"""Probe: record what the EngineCore really runs with, for opsctl to show the truth.

Wraps ``Scheduler.__init__`` (EngineCore process) and appends one JSON line to
``<run>/events/engine_info.jsonl``: KV cache groups (spec type, layers, block size,
sliding window), number of blocks, and the engine settings diagnostics depend on
(prefix caching, mm processor cache, KV transfer config, eager mode, platform, async
scheduling, and whether the V2 model runner runs: ``use_v2_model_runner``, None where that
vLLM has no such setting; kv-fail names vLLM's recovery defects by them). For a
multimodal model also whether vLLM treats it as one (``multimodal``), the processor
cache type and the items per prompt it accepts (``limit_mm_per_prompt``); ``None``
for a text-only model.
Read it with ``opsctl.collectors.ledger.read_events(run_dir, "engine_info")``.
"""

from __future__ import annotations

import functools

from engine_patches.patch import APPLIED, Outcome, probe, symbols
from engine_patches.records import platform_name, record_event
from engine_patches.wrapping import ALREADY, Originals

ORIGINALS = Originals()
MARK = "_opsctl_engine_info"


def _safe(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def _limits(mm) -> dict | None:
    """``limit_per_prompt`` as {modality: count} (vLLM keeps option objects there)."""
    if mm is None:
        return None
    return {str(k): getattr(v, "count", v) for k, v in dict(mm.limit_per_prompt).items()}


def describe(scheduler) -> dict:
    """The ``engine_info`` event of a scheduler.

    Its KV cache groups and the engine settings diagnostics depend on (None where
    this vLLM lacks one)."""
    kv = scheduler.kv_cache_config
    groups = []
    for g in kv.kv_cache_groups:
        spec = g.kv_cache_spec
        groups.append(
            {
                "spec": type(spec).__name__,
                "layers": len(g.layer_names),
                "block_size": getattr(spec, "block_size", None),
                "sliding_window": getattr(spec, "sliding_window", None),
            }
        )
    vc = scheduler.vllm_config
    ktc = vc.kv_transfer_config
    return {
        "kv_cache_groups": groups,
        "num_blocks": _safe(lambda: kv.num_blocks),
        "platform": platform_name(),
        "model": _safe(lambda: vc.model_config.model),
        "enable_prefix_caching": _safe(lambda: vc.cache_config.enable_prefix_caching),
        "mm_processor_cache_gb": _safe(
            lambda: vc.model_config.multimodal_config.mm_processor_cache_gb
        ),
        "multimodal": _safe(lambda: vc.model_config.multimodal_config is not None),
        "mm_processor_cache_type": _safe(
            lambda: vc.model_config.multimodal_config.mm_processor_cache_type
        ),
        "limit_mm_per_prompt": _safe(lambda: _limits(vc.model_config.multimodal_config)),
        "enforce_eager": _safe(lambda: vc.model_config.enforce_eager),
        "compilation_mode": _safe(lambda: str(vc.compilation_config.mode)),
        "max_num_seqs": _safe(lambda: vc.scheduler_config.max_num_seqs),
        "kv_connector": _safe(lambda: ktc.kv_connector if ktc else None),
        "kv_load_failure_policy": _safe(lambda: ktc.kv_load_failure_policy if ktc else None),
        "async_scheduling": _flag(lambda: vc.scheduler_config.async_scheduling),
        "v2_model_runner": _flag(lambda: vc.use_v2_model_runner),
    }


def _flag(fn) -> bool | None:
    """A setting as true/false; None where this vLLM has no such attribute (or it fails)."""
    value = _safe(fn)
    return value if isinstance(value, bool) else None


def _wrap(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            record_event("engine_info", describe(self))
        except Exception as exc:  # a probe never breaks the engine
            record_event("engine_info", {"error": repr(exc)})

    return __init__


def apply() -> Outcome:
    """Wrap ``Scheduler.__init__`` so each new scheduler records its ``engine_info``."""
    from vllm.v1.core.sched import scheduler as sched_mod

    if not ORIGINALS.wrap(sched_mod.Scheduler, "__init__", _wrap, MARK, key="init"):
        return ALREADY
    return Outcome(APPLIED, "records KV cache groups and engine settings at scheduler init")


PATCH = probe(
    "engine_info_probe",
    reason="opsctl probe: show the KV cache groups and settings the EngineCore really uses",
    apply=apply,
    roles=("engine_core",),
    symbols=symbols("vllm.v1.core.sched.scheduler", "Scheduler.__init__"),
)
