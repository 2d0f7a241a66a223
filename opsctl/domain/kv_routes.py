"""Which KV load-failure routes a vLLM release handles, read from its sources (pure).

The texts come from the caller. Said in words an operator acts on: which connector behaviour is safe
on which release, and what opsctl's patches add. The upgrade preflight (`opsctl patches --against`)
shows it; docs/gpu.md and tests/patches/test_kv_recovery.py hold the evidence behind each rule.

A connector reports a failed load one of two ways: failed *blocks*
(``get_block_ids_with_load_errors``, for loads done in the step that computes the rest
of the prompt) or failed *requests* (``KVConnectorTransferResults.failed_recving``, for
asynchronous loads, vLLM 0.30+).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opsctl.domain.preflight import extract
from opsctl.domain.records import record

SCHEDULER = "vllm.v1.core.sched.scheduler"
CONNECTOR_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
MODULES = (SCHEDULER, CONNECTOR_BASE, V2_RUNNER, V1_RUNNER)

SAFE, PATCHED, UNSAFE, ABSENT, UNKNOWN = "safe", "safe with opsctl", "unsafe", "absent", "unknown"


@dataclass(frozen=True, slots=True)
class Route:
    """One KV load-failure route, its status on the release, and the advice for it."""

    route: str  # "requests" | "blocks, several KV cache groups" | "blocks, one group"
    status: str  # safe | safe with opsctl | unsafe | absent | unknown
    advice: str

    def to_dict(self) -> dict[str, str]:
        """The route as the report holds it."""
        return record(self)


def _requests(sched: str, base: str) -> Route:
    name = "failed requests (async loads)"
    if "failed_recving" not in base or "def _handle_failed_recving" not in sched:
        why = "no request-level route in this release: connectors can only report failed blocks"
        return Route(name, ABSENT, why)
    return Route(
        name,
        SAFE,
        "safe for asynchronous loads under both policies, any runner, one or several KV "
        "cache groups: recompute restarts the request from token 0, fail ends it with an "
        "error; the connector must not offer the failed KV again (vLLM asks it again), "
        "and a failed synchronous load has no request-level route (ignored)",
    )


def _blocks_multi(sched: str) -> Route:
    name = "failed blocks, several KV cache groups"
    handle = extract(sched, "Scheduler._handle_invalid_blocks") or ""
    update = extract(sched, "Scheduler._update_requests_with_invalid_blocks") or ""
    if "with multiple KV cache groups" in handle or "Connectors must report failed" in handle:
        return Route(
            name,
            PATCHED,
            "vLLM raises RuntimeError on the first failed block (the EngineCore dies, "
            "whatever the policy): safe only with opsctl's kv_hybrid_recompute; else report "
            "failed requests",
        )
    if "(req_block_ids,) = self.kv_cache_manager.get_block_ids" in update + handle:
        return Route(
            name,
            PATCHED,
            "vLLM fails a single-group unpack (ValueError: the EngineCore dies): safe only "
            "with opsctl's kv_hybrid_recompute",
        )
    return Route(name, SAFE, "handled upstream: an affected request recomputes from token 0")


def _blocks_single(sched: str, v2: str | None, v1: str | None) -> Route:
    name = "failed blocks, one KV cache group"
    path = "".join(
        extract(sched, f"Scheduler.{f}") or ""
        for f in ("_handle_invalid_blocks", "_update_requests_with_invalid_blocks")
    )
    inflight_fixed = any(
        m in path for m in ("num_output_placeholders", "stale_output", "async_tokens_to_discard")
    )
    update = extract(v2, "GPUModelRunner.update_requests") if v2 else None
    v2_fixed = update is None or any(
        m in update for m in ("rewound_req_ids", "num_computed_tokens.stage_write")
    )
    if inflight_fixed and v2_fixed:
        return Route(name, SAFE, "recompute and fail are both right upstream")
    wrong = []
    if not v2_fixed:
        wrong.append("the V2 model runner (the CUDA default) ignores the rewind (kv_rewind_v2)")
    if not inflight_fixed:
        wrong.append("async scheduling keeps the step in flight (kv_async_inflight)")
    plain = (
        "; unpatched, exact only with VLLM_USE_V2_MODEL_RUNNER=0 and --no-async-scheduling"
        if v1 is not None
        else "; this release has no V1 runner to fall back to"
    )
    return Route(
        name,
        PATCHED,
        "policy fail is safe; recompute returns tokens computed over the failed block "
        f"unless opsctl's patches fix it: {'; '.join(wrong)}{plain}",
    )


def routes(texts: Mapping[str, str | None]) -> list[Route]:
    """The routes of the release whose module sources are ``texts``.

    ``texts``: ``MODULES`` -> source text or None. Without the scheduler's source nothing can be
    said.
    """
    sched = texts.get(SCHEDULER)
    if not sched or "def _handle_invalid_blocks" not in sched:
        why = "the scheduler's KV failure path was not found in this release's sources"
        return [Route("any", UNKNOWN, why)]
    base = texts.get(CONNECTOR_BASE) or ""
    return [
        _requests(sched, base),
        _blocks_multi(sched),
        _blocks_single(sched, texts.get(V2_RUNNER), texts.get(V1_RUNNER)),
    ]
