"""Multi-group (hybrid) KV caches recompute after a failed KV load (vLLM PR 50388).

Never a crash: vLLM issues 45474 and 50687.

A KV connector reports blocks whose external load failed through
``get_block_ids_with_load_errors()``. vLLM's scheduler then rewinds the affected
requests (policy ``recompute``) or fails them (policy ``fail``). For a model with
more than one KV cache group (sliding window + full attention, Mamba + attention)
vLLM 0.31 to 0.34 raise RuntimeError up front in ``Scheduler._handle_invalid_blocks``
("Connectors must report failed requests via KVConnectorTransferResults.failed_recving
instead", whatever the policy), 0.26 to 0.29 raise ValueError from a single-group unpack
(0.30 handled several groups upstream); the EngineCore dies and every request on the
instance fails. Upstream's supported route for several groups, ``failed_recving``,
covers asynchronous loads only: a failed synchronous load has no upstream route.

This patch wraps ``Scheduler._handle_invalid_blocks`` in the EngineCore process:

- one KV cache group: the original method runs, unchanged (block-level truncation
  to the longest valid prefix).
- several groups: the groups sit on different block grids, so there is no single
  valid prefix; an affected request recomputes from the beginning instead.
  * Each request's block list of every group is scanned over the blocks that may
    hold externally computed tokens.
  * The null block (shared padding: tokens that slid out of a window, Mamba
    ``align`` mode's positions before the latest state) is never counted as a
    failed block: it never goes into the "already marked" set (every request
    shares it, so marking it would restart them all as sharers) and is never
    evicted. What a reported null id means depends on the group (upstream's
    contract as vLLM's tests/v1/kv_connector/unit/
    test_hybrid_kv_load_failure_recovery.py pins it; the attention/state split
    is how this patch keeps both that test and the null-block rule):
    - attention group (full, sliding window, ...): a null position holds no KV
      the request reads, so the report changes nothing for that request;
    - state group (Mamba/SSM): the group's positions before the latest state are
      the null id in ``align`` mode and the state at the end depends on all of
      them, so a failure reported there is fatal to the whole prefix ("an
      invalid state (mamba) block is equally fatal to the shared prefix"): the
      request replays from zero, and the group's real blocks after that position
      (the states computed on top of it) are evicted; the null block is not.
  * Failed blocks still go into the "already marked" set, so a request sharing a
    failed block is affected as well. Upstream's single-group path lets such a
    sharer keep the block because the first request recomputes it in place; here
    the first request restarts on fresh blocks, so a sharer restarts too.
  * policy ``recompute``: a running (sync-load) request is preempted back to the
    waiting queue with ``num_computed_tokens = 0``, reading neither the prefix cache
    nor the connector again (:func:`recompute_locally`: ``skip_reading_prefix_cache``,
    0.34's ``prefix_cache_hit_limit``, and a guard on the connector's
    ``get_num_new_matched_tokens``, which 0.26 does not gate), so it is recomputed on
    fresh blocks rather than rewritten in place (a
    sliding-window group maps out-of-window positions to the null block, which an
    in-place recompute would write). An async-load request gets
    ``num_computed_tokens = 0`` and is released as a failed receive (its blocks are
    freed, not cached). Failed blocks and their downstream blocks are evicted from
    the prefix cache so no later request reuses them.
  * policy ``fail``: the affected requests finish with an error (the caller does
    that with the returned ids), their failed blocks are evicted, the engine and
    every other request live on.
  Each recovery logs vLLM's own line ("Recovered from KV load failure: N
  request(s) rescheduled (M tokens affected).") and appends a ``kv_recoveries``
  event to the run directory.

On an installed vLLM whose scheduler already handles several groups the patch
reports "already upstream" and changes nothing. ``ORIGINALS`` keeps the wrapped
method so tests can undo the patch (:func:`revert`).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Iterable

from engine_patches.patch import APPLIED, Outcome, Sources, declare
from engine_patches.records import record_quietly
from engine_patches.wrapping import ALREADY, Originals, settled

ORIGINALS = Originals()
MARK = "_opsctl_kv_hybrid_recompute"

# What the unpatched scheduler does with several groups (either one means: crash).
_CRASH_MARKERS = (
    "with multiple KV cache groups",  # 0.32: RuntimeError in _handle_invalid_blocks
    # 0.26-0.29: single-group unpack -> ValueError (0.30's handled path unpacks per group)
    "(req_block_ids,) = self.kv_cache_manager.get_block_ids",
)


HANDLE = "vllm.v1.core.sched.scheduler:Scheduler._handle_invalid_blocks"
UPDATE = "vllm.v1.core.sched.scheduler:Scheduler._update_requests_with_invalid_blocks"
SYMBOLS = (HANDLE, UPDATE)


def upstream_rule(sources: Sources) -> tuple[bool | None, str]:
    """Whether the scheduler already recovers several groups, from its source.

    (True | False: it crashes | None: the target is missing, why), from the source text of
    :data:`SYMBOLS` (installed or read from a wheel)."""
    if sources.get(HANDLE) is None:
        return None, "Scheduler._handle_invalid_blocks not found (vLLM changed its KV failure path)"
    text = "\n".join(src for src in (sources.get(HANDLE), sources.get(UPDATE)) if src)
    for marker in _CRASH_MARKERS:
        if marker in text:
            return False, f"scheduler crashes on several groups ({marker!r})"
    return True, "scheduler has no single-group-only failure path"


def upstream_handles_multi_group(scheduler_cls: type) -> tuple[bool | None, str]:
    """:func:`upstream_rule` on a scheduler class (the installed one, or a test's)."""
    sources: dict[str, str | None] = {}
    for name in SYMBOLS:
        fn = getattr(scheduler_cls, name.rsplit(".", 1)[1], None)
        if fn is None:
            sources[name] = None
            continue
        try:
            sources[name] = inspect.getsource(inspect.unwrap(fn))
        except (OSError, TypeError):
            return None, "cannot read the scheduler's source to decide"
    handled, why = upstream_rule(sources)
    return handled, why.replace("scheduler", "installed scheduler", 1)


def _is_state_spec(spec) -> bool:
    """A recurrent-state group (Mamba/SSM), as opposed to an attention group."""
    from vllm.v1.kv_cache_interface import MambaSpec

    inner = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
    specs = list(inner.values()) if isinstance(inner, dict) and inner else [spec]
    return all(isinstance(s, MambaSpec) for s in specs)


def _group_layout(scheduler) -> list[tuple[int, bool]]:
    """(block size in tokens, is a state group) for each KV cache group."""
    scale = max(1, int(getattr(scheduler, "dcp_world_size", 1) or 1)) * max(
        1, int(getattr(scheduler, "pcp_world_size", 1) or 1)
    )
    layout = []
    for group in scheduler.kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        size = int(getattr(spec, "block_size", 0) or scheduler.block_size)
        layout.append((size * scale, _is_state_spec(spec)))
    return layout


def _scan_group(
    group: int,
    block_ids: list[int],
    n_blocks: int,
    invalid_block_ids: set[int],
    marked: set[int],
    null_id: int,
    state_group: bool,
) -> tuple[list[dict], int | None]:
    """Hits in one group's first ``n_blocks`` blocks, and the position from which
    the group's blocks are to be evicted (None: nothing of this group)."""
    hits: list[dict] = []
    evict_from: int | None = None
    for pos in range(n_blocks):
        block_id = block_ids[pos]
        if block_id not in invalid_block_ids:
            continue
        hit = {"group": group, "position": pos, "block": block_id, "shared": False}
        if block_id == null_id:
            if not state_group:
                continue  # an attention group reads no KV at a null position
            # the state after this position depends on it; never marked/evicted
            hits.append({**hit, "null": True})
            evict_from = pos if evict_from is None else evict_from
            continue
        hit["shared"] = block_id in marked
        hits.append(hit)
        if hit["shared"]:
            continue  # marked by an earlier request; this one restarts too
        marked.add(block_id)
        evict_from = pos if evict_from is None else evict_from
    return hits, evict_from


def scan_requests(
    scheduler,
    requests: Iterable,
    invalid_block_ids: set[int],
    num_scheduled_tokens: dict[str, int],
    marked: set[int],
    *,
    evict_blocks: bool,
) -> tuple[list, int, set[int], list[dict]]:
    """Find the requests whose externally computed blocks (any group) failed.

    Returns (affected requests, tokens to recompute, blocks to evict, details).
    Sets ``num_computed_tokens = 0`` on every affected request. ``marked`` is the
    "already marked" set shared across the scan of async and running requests.
    """
    manager = scheduler.kv_cache_manager
    null_id = manager.block_pool.null_block.block_id
    layout = _group_layout(scheduler)
    affected: list = []
    total_tokens = 0
    to_evict: set[int] = set()
    details: list[dict] = []
    for request in requests:
        req_id = request.request_id
        computed = request.num_computed_tokens - num_scheduled_tokens.get(req_id, 0)
        if computed <= 0:
            continue
        hits: list[dict] = []
        for group, block_ids in enumerate(manager.get_block_ids(req_id)):
            size, state_group = (
                layout[group] if group < len(layout) else (scheduler.block_size, False)
            )
            n_blocks = min(len(block_ids), -(-computed // size))
            group_hits, evict_from = _scan_group(
                group, block_ids, n_blocks, invalid_block_ids, marked, null_id, state_group
            )
            hits += group_hits
            if evict_blocks and evict_from is not None:
                to_evict.update(b for b in block_ids[evict_from:] if b != null_id)
        if not hits:
            continue
        request.num_computed_tokens = 0
        total_tokens += computed
        affected.append(request)
        details.append(
            {
                "request_id": req_id,
                "tokens": computed,
                "blocks": hits,
                "shared_only": all(h["shared"] for h in hits),
            }
        )
    return affected, total_tokens, to_evict, details


def handle_multi_group(
    self, invalid_block_ids: set[int], num_scheduled_tokens: dict[str, int]
) -> set[str]:
    """``Scheduler._handle_invalid_blocks`` for several KV cache groups."""
    from vllm.logger import init_logger
    from vllm.v1.request import RequestStatus

    logger = init_logger("vllm.v1.core.sched.scheduler")
    # The null block stays in the set: scan_requests decides per group what a
    # reported null id means, and never marks or evicts it.
    invalid = set(invalid_block_ids)
    recompute = bool(self.recompute_kv_load_failures)
    marked: set[int] = set()
    holding: Iterable = getattr(self, "kv_holding_waiting", None) or ()
    if not hasattr(self, "kv_holding_waiting"):  # older releases
        holding = getattr(self, "skipped_waiting", None) or ()
    async_reqs = [r for r in holding if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
    async_hit, async_tokens, _, async_details = scan_requests(
        self, async_reqs, invalid, num_scheduled_tokens, marked, evict_blocks=False
    )
    sync_hit, sync_tokens, to_evict, sync_details = scan_requests(
        self, list(self.running), invalid, num_scheduled_tokens, marked, evict_blocks=True
    )
    n_requests = len(async_hit) + len(sync_hit)
    n_tokens = async_tokens + sync_tokens
    if not n_requests:
        return set()
    # A failed block must not be found again through the prefix cache: the
    # requests that loaded it restart on fresh blocks (both policies).
    if to_evict:
        self.kv_cache_manager.evict_blocks(to_evict)
    async_ids = {r.request_id for r in async_hit}
    sync_ids = {r.request_id for r in sync_hit}
    event = {
        "policy": "recompute" if recompute else "fail",
        "groups": len(self.kv_cache_config.kv_cache_groups),
        "requests": n_requests,
        "tokens": n_tokens,
        "evicted_blocks": len(to_evict),
        "details": async_details + sync_details,
    }
    if not recompute:
        failed = async_ids | sync_ids
        logger.error(
            "Failing %d request(s) due to KV load failure "
            "(failure_policy=fail, %d tokens affected). Request IDs: %s",
            n_requests,
            n_tokens,
            failed,
        )
        record_quietly("kv_recoveries", {**event, "action": "failed"})
        return failed
    now = time.monotonic()
    for request in async_hit:
        recompute_locally(self, request)
    for request in sync_hit:
        recompute_locally(self, request)
        self.running.remove(request)
        self._preempt_request(request, now)
    logger.warning(
        "Recovered from KV load failure: %d request(s) rescheduled (%d tokens affected).",
        n_requests,
        n_tokens,
    )
    record_quietly("kv_recoveries", {**event, "action": "recomputed"})
    # async requests are released as failed receives once their transfer ends
    self.failed_recving_kv_req_ids |= async_ids
    return sync_ids


GUARD = "_opsctl_local_recompute"  # on a request: never load its KV from the connector again


def recompute_locally(scheduler, request) -> None:
    """Make a request's restart read neither the prefix cache nor the connector.

    Else the KV that failed to load would be loaded (and fail) again,
    for ever on a connector that keeps failing (seen on vLLM 0.26 on the H200: 18,646
    recoveries in 200 s). Each release spells it differently: 0.32/0.33 read
    ``skip_reading_prefix_cache`` for both lookups, 0.34 has ``prefix_cache_hit_limit``
    instead, 0.26 reads the flag for the local cache only; the connector guard
    (:func:`guard_connector`) covers every release."""
    request.skip_reading_prefix_cache = True
    if hasattr(request, "prefix_cache_hit_limit"):  # 0.34: 0 blocks both lookups
        request.prefix_cache_hit_limit = 0
    setattr(request, GUARD, True)
    guard_connector(scheduler)


def guard_connector(scheduler) -> None:
    """Wrap the scheduler's connector once so it offers nothing to a local recompute.

    A request marked by :func:`recompute_locally` is told the connector has nothing
    for it."""
    connector = getattr(scheduler, "connector", None)
    if connector is None or getattr(connector, "__dict__", {}).get(GUARD):
        return
    original = connector.get_num_new_matched_tokens

    @functools.wraps(original)
    def get_num_new_matched_tokens(request, num_computed_tokens):
        if getattr(request, GUARD, False):
            return 0, False
        return original(request, num_computed_tokens)

    connector.get_num_new_matched_tokens = get_num_new_matched_tokens
    setattr(connector, GUARD, True)


def wrap(original):
    """The patched ``Scheduler._handle_invalid_blocks``.

    ``Scheduler._handle_invalid_blocks`` that takes the multi-group path for a KV
    cache of several groups and the original otherwise."""

    @functools.wraps(original)
    def _handle_invalid_blocks(self, invalid_block_ids, num_scheduled_tokens):
        if len(self.kv_cache_config.kv_cache_groups) <= 1:
            return original(self, invalid_block_ids, num_scheduled_tokens)
        return handle_multi_group(self, invalid_block_ids, num_scheduled_tokens)

    return _handle_invalid_blocks


def apply() -> Outcome:
    """Wrap ``Scheduler._handle_invalid_blocks`` unless upstream handles several groups."""
    from vllm.v1.core.sched import scheduler as sched_mod

    cls = sched_mod.Scheduler
    current = getattr(cls, "_handle_invalid_blocks", None)
    if current is not None and getattr(current, MARK, False):
        return ALREADY
    handled, why = upstream_handles_multi_group(cls)
    outcome = settled(handled, why)
    if outcome is not None:
        return outcome
    ORIGINALS.wrap(cls, "_handle_invalid_blocks", wrap, MARK)
    return Outcome(APPLIED, f"multi-group KV load failures recompute from the start ({why})")


def revert() -> None:
    """Undo :func:`apply` in this process (tests)."""
    ORIGINALS.restore()


PATCH = declare(
    "kv_hybrid_recompute",
    versions="vLLM < PR 50388 (0.31-0.34 raise RuntimeError; 0.26-0.29 ValueError)",
    reason="PR 50388 / issues 45474, 50687: one failed KV block load on a hybrid "
    "model killed the EngineCore; affected requests now recompute from the start",
    apply=apply,
    roles=("engine_core",),
    verified_on=("0.32.0",),
    symbols=SYMBOLS,
    watch=("vllm.v1.core.sched.scheduler:Scheduler._preempt_request",),
    upstream=upstream_rule,
    attributes=(
        # 0.26-0.33 read skip_reading_prefix_cache; 0.34 has prefix_cache_hit_limit instead
        "vllm.v1.request:Request.skip_reading_prefix_cache|prefix_cache_hit_limit",
        "vllm.v1.request:Request.num_computed_tokens",
        "vllm.v1.request:Request.status",
        *(
            f"vllm.v1.core.sched.scheduler:Scheduler.{a}"
            for a in (
                "running",
                "failed_recving_kv_req_ids",
                "kv_cache_config",
                "kv_cache_manager",
                "recompute_kv_load_failures",
                "block_size",
                "connector",
            )
        ),
    ),
)
