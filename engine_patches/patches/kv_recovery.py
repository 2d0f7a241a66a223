"""KV load failures recover on CUDA vLLM's V2 runner and with async scheduling.

The V2 model runner honours the scheduler's rewind, and async scheduling drops the
step that was in flight (vLLM issue 49250; PRs 49252 and 53298, open).

When a KV connector reports blocks whose load failed (``invalid_block_ids``) and the
policy is ``recompute``, vLLM's scheduler truncates each affected request's
``num_computed_tokens`` to the first failed block and schedules the rest again. Two
defects make that recovery return tokens computed over the corrupted blocks on CUDA
vLLM in its default configuration (docs/gpu.md, "kv-fail on CUDA: root cause"):

1. **kv_rewind_v2** — the V2 model runner (``vllm/v1/worker/gpu/model_runner.py``, the
   default on CUDA) copies the rewound count only into its CPU mirror
   (``req_states.num_computed_tokens_np``) in ``update_requests``; positions, input ids
   and slot mappings come from the device-side ``req_states.num_computed_tokens``, which
   only ever moves forward. The recompute then computes positions past the prompt and
   never rewrites the failed block. The token sampled over the bad block also stays in
   the runner's bookkeeping (``total_len``, ``all_token_ids``, the penalties' output bin
   counts), so penalties and logprobs would see it.

   The patch has two halves. In the scheduler (EngineCore), every request the failure
   path rewinds in place is remembered, and the next ``SchedulerOutput`` that schedules
   it carries the ids in ``scheduled_cached_reqs.rewound_req_ids`` (the name upstream's
   PR 53298 gives the field; an attribute on the instance, so it travels with the
   object). In the runner, ``update_requests`` then sets, for each such request, the
   device-side count to the scheduler's, ``total_len`` to ``prompt_len +
   num_output_tokens`` (the scheduler's count of kept output tokens), and takes the
   dropped tokens (``all_token_ids[total_len:old total_len]``) out of the output bin
   counts. Only rewound requests are touched (one device read each, on a failure), so a
   step without a failure costs one set lookup.

2. **kv_async_inflight** — with async scheduling the request's next step (a decode fed
   the token sampled over the bad block) is scheduled before the failure is reported.
   The failure path skips the failed step's own output but keeps the in-flight frames
   and their ``num_output_placeholders``, so the next frame's token is returned to the
   client and the recompute is scheduled with extra placeholder tokens. The patch does
   for every request the failure path rewinds or preempts what vLLM does for a
   preempted request's stale frames: the frames after the failed step are dropped
   (0.26: ``async_tokens_to_discard``; 0.32+: ``num_stale_output_tokens`` with
   ``drop_stale_output``) and the placeholders are zeroed. A request that is finished
   (policy ``fail``) needs nothing: vLLM ignores output for finished requests.

Both wrap ``Scheduler._handle_invalid_blocks`` outside ``kv_hybrid_recompute`` (module
order: that patch wraps first), so they see the multi-group path's preempted requests
too. Each recovery they act on appends a ``kv_recovery`` event to the run directory.
On a vLLM whose sources already do it (the rules below read them) a patch reports
"already upstream"; on a vLLM without the V2 runner ``kv_rewind_v2`` is skipped.
``revert()`` undoes both (tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from engine_patches.patch import APPLIED, Outcome, Sources, UpstreamRule, declare, dotted
from engine_patches.records import record_quietly
from engine_patches.wrapping import ALREADY, Originals, decide_upstream

SCHED = "vllm.v1.core.sched.scheduler"
ASYNC = "vllm.v1.core.sched.async_scheduler"
V2 = "vllm.v1.worker.gpu.model_runner"

HANDLE = f"{SCHED}:Scheduler._handle_invalid_blocks"
UPDATE_INVALID = f"{SCHED}:Scheduler._update_requests_with_invalid_blocks"
SCHEDULE = f"{SCHED}:Scheduler.schedule"
UPDATE_FROM_OUTPUT = f"{SCHED}:Scheduler.update_from_output"
AFTER_SCHEDULE = f"{ASYNC}:AsyncScheduler._update_after_schedule"
RUNNER_UPDATE = f"{V2}:GPUModelRunner.update_requests"

MARK = "_opsctl_kv_recovery"  # its value: the patch that wrapped
ORIGINALS = Originals()  # (patch, "module:Qual.name") -> (owner, attribute, original)

# the attribute the scheduler half sets on CachedRequestData (upstream PR 53298's name)
REWOUND_FIELD = "rewound_req_ids"


def _record(event: dict) -> None:
    record_quietly("kv_recovery", event)


def _recompute(scheduler) -> bool:
    return bool(getattr(scheduler, "recompute_kv_load_failures", False))


# ---------------------------------------------------------------- upstream rules


def rewind_rule(sources: Sources) -> tuple[bool | None, str]:
    """Whether the V2 runner already applies a rewind on the device, from its source.

    (True: the V2 runner already writes a rewound count to the device | False: it
    writes only the CPU mirror | None: no V2 runner, why)."""
    src = sources.get(RUNNER_UPDATE)
    if src is None:
        return None, "no V2 model runner (GPUModelRunner.update_requests) in this vLLM"
    if sources.get(HANDLE) is None:
        return None, "Scheduler._handle_invalid_blocks not found (vLLM changed its KV failure path)"
    if REWOUND_FIELD in src or "num_computed_tokens.stage_write" in src:
        return True, "V2 update_requests writes the rewound count to the device"
    return False, "V2 update_requests writes num_computed_tokens to the CPU mirror only"


def inflight_rule(sources: Sources) -> tuple[bool | None, str]:
    """Whether the KV failure path already drops in-flight output, from its source.

    (True: the failure path already drops in-flight output | False: it keeps it |
    None: the failure path is gone, why)."""
    handle, update = sources.get(HANDLE), sources.get(UPDATE_INVALID)
    if handle is None:
        return None, "Scheduler._handle_invalid_blocks not found (vLLM changed its KV failure path)"
    text = handle + (update or "")
    for marker in ("num_output_placeholders", "stale_output", "async_tokens_to_discard"):
        if marker in text:
            return True, f"the KV failure path handles in-flight output ({marker})"
    return False, "the KV failure path keeps in-flight async output and placeholders"


# ---------------------------------------------------------------- kv_async_inflight


def drop_inflight(scheduler, request, added_this_step: int) -> tuple[int, str]:
    """Drop a request's output still in flight after its failed KV load.

    As vLLM does for a preempted request's stale frames. Returns how much was marked and in
    what unit: scheduled tokens (0.32+, drained in lockstep with each step, the failed
    step's share included) or output frames (0.26, one per output). ``added_this_step`` is
    the placeholders the failed step itself reserved (vLLM skips its frame, so it is not
    dropped again)."""
    placeholders = int(getattr(request, "num_output_placeholders", 0) or 0)
    if hasattr(request, "num_stale_output_tokens"):  # 0.32+
        stale = int(getattr(request, "num_in_flight_tokens", 0) or 0)
        request.num_stale_output_tokens = stale
        request.drop_stale_output = True
        request.num_output_placeholders = 0
        return stale, "tokens"
    if hasattr(request, "async_tokens_to_discard"):  # 0.26
        frames = max(0, placeholders - added_this_step)
        request.async_tokens_to_discard = int(request.async_tokens_to_discard or 0) + frames
        request.num_output_placeholders = 0
        return frames, "frames"
    request.num_output_placeholders = 0
    return 0, "frames"


def _wrap_handle_inflight(original):
    @functools.wraps(original)
    def _handle_invalid_blocks(self, invalid_block_ids, num_scheduled_tokens):
        affected = original(self, invalid_block_ids, num_scheduled_tokens)
        if not affected or not _recompute(self):
            return affected  # fail: the requests finish, vLLM drops their later output
        step = getattr(self, "_opsctl_step_output", None)
        added = getattr(self, "_opsctl_placeholders", {}).get(id(step), {})
        dropped, unit = {}, "frames"
        for req_id in affected:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            n, unit = drop_inflight(self, request, int(added.get(req_id, 0)))
            if n:
                dropped[req_id] = n
        if dropped:
            _record(
                {
                    "patch": "kv_async_inflight",
                    "action": "dropped_inflight",
                    "requests": dropped,
                    "unit": unit,
                }
            )
        return affected

    return _handle_invalid_blocks


def _wrap_after_schedule(original):
    """Remember the placeholders each request's step reserved (0.26 only needs it)."""

    @functools.wraps(original)
    def _update_after_schedule(self, scheduler_output):
        if getattr(self, "connector", None) is None:  # no connector: no failed load, ever
            return original(self, scheduler_output)
        before = {
            r: self.requests[r].num_output_placeholders
            for r in scheduler_output.num_scheduled_tokens
        }
        original(self, scheduler_output)
        added = {}
        for req_id, n in before.items():
            delta = self.requests[req_id].num_output_placeholders - n
            if delta:
                added[req_id] = delta
        if added:
            table = self.__dict__.setdefault("_opsctl_placeholders", {})
            if len(table) > 64:  # a step that never came back (engine error): forget it
                table.clear()
            table[id(scheduler_output)] = added

    return _update_after_schedule


def _wrap_update_from_output(original):
    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):
        if getattr(self, "connector", None) is None:  # no connector: no failed load, ever
            return original(self, scheduler_output, model_runner_output)
        self._opsctl_step_output = scheduler_output
        try:
            return original(self, scheduler_output, model_runner_output)
        finally:
            self._opsctl_step_output = None
            table = self.__dict__.get("_opsctl_placeholders")
            if table:
                table.pop(id(scheduler_output), None)

    return update_from_output


# ---------------------------------------------------------------- kv_rewind_v2


def _wrap_handle_rewind(original):
    @functools.wraps(original)
    def _handle_invalid_blocks(self, invalid_block_ids, num_scheduled_tokens):
        affected = original(self, invalid_block_ids, num_scheduled_tokens)
        if affected and _recompute(self):
            from vllm.v1.request import RequestStatus

            pending = self.__dict__.setdefault("_opsctl_rewound", set())
            for req_id in affected:
                request = self.requests.get(req_id)
                # rewound in place (still running); a preempted one comes back as new
                if request is not None and request.status == RequestStatus.RUNNING:
                    pending.add(req_id)
        return affected

    return _handle_invalid_blocks


def _wrap_schedule(original):
    @functools.wraps(original)
    def schedule(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        pending = self.__dict__.get("_opsctl_rewound")
        if pending:
            cached = out.scheduled_cached_reqs
            now = pending.intersection(cached.req_ids)
            if now:
                setattr(cached, REWOUND_FIELD, set(now))
            # sent, or no longer a cached request of the runner (new again, finished)
            pending.difference_update(now)
            pending.difference_update(r.req_id for r in out.scheduled_new_reqs)
            pending.intersection_update(
                r for r in pending if r in self.requests and not self.requests[r].is_finished()
            )
        return out

    return schedule


def rewind_runner_state(runner, cached_reqs, rewound: set[str]) -> list[dict]:
    """Rewind the V2 runner's state of each rewound request to the scheduler's.

    The state: the device-side computed count, ``total_len``, and the output bin counts of the
    tokens the failure dropped. Returns one record per request (for the event)."""
    import torch

    rs = runner.req_states
    counts = None
    sampler = getattr(runner, "sampler", None)
    penalties = getattr(sampler, "penalties_state", None)
    if penalties is not None:
        counts = getattr(penalties, "output_bin_counts", None)
    n_out = getattr(cached_reqs, "num_output_tokens", None)
    records = []
    for pos, req_id in enumerate(cached_reqs.req_ids):
        if req_id not in rewound or req_id not in rs.req_id_to_index:
            continue
        i = rs.req_id_to_index[req_id]
        sched = int(cached_reqs.num_computed_tokens[pos])
        device = rs.num_computed_tokens.gpu
        old_computed = int(device[i].item())
        rs.num_computed_tokens.gpu[i] = sched
        record = {"req_id": req_id, "device_computed": old_computed, "scheduler_computed": sched}
        if n_out is not None:
            total = int(rs.prompt_len.np[i]) + int(n_out[pos])
            old_total = int(rs.total_len.gpu[i].item())
            if old_total > total:
                dropped = rs.all_token_ids.gpu[i, total:old_total].to(torch.long)
                if counts is not None and dropped.numel():
                    ones = torch.ones_like(dropped, dtype=counts.dtype)
                    counts[i].index_put_(
                        (dropped.to(counts.device),), -ones.to(counts.device), accumulate=True
                    )
                rs.total_len.gpu[i] = total
                record.update(total_len=total, dropped_tokens=old_total - total)
        records.append(record)
    return records


def _wrap_runner_update(original):
    @functools.wraps(original)
    def update_requests(self, scheduler_output):
        original(self, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        rewound = getattr(cached, REWOUND_FIELD, None)
        if rewound:
            records = rewind_runner_state(self, cached, set(rewound))
            if records:
                _record({"patch": "kv_rewind_v2", "action": "rewound_runner", "requests": records})

    return update_requests


# ---------------------------------------------------------------- apply / revert

Install = tuple[type, str, str, Callable[[Any], Any]]  # owner, attribute, symbol, wrapper


def _apply(patch: str, rule: UpstreamRule, names: Iterable[str], installs, done: str) -> Outcome:
    """Wrap what ``installs()`` lists (imported only when the patch is needed) unless
    ``rule`` finds the fix in the installed sources of ``names``; ``done``'s ``{why}``
    is the rule's reason."""
    outcome, why = decide_upstream(rule, names)
    if outcome is not None:
        return outcome
    new = [
        ORIGINALS.wrap(owner, attr, wrapper, MARK, value=patch, key=(patch, symbol))
        for owner, attr, symbol, wrapper in installs()
    ]
    if not new[0]:
        return ALREADY
    return Outcome(APPLIED, done.format(why=why))


def _inflight_targets() -> list[Install]:
    from vllm.v1.core.sched import async_scheduler, scheduler

    sched = scheduler.Scheduler
    return [
        (sched, "_handle_invalid_blocks", HANDLE, _wrap_handle_inflight),
        (sched, "update_from_output", UPDATE_FROM_OUTPUT, _wrap_update_from_output),
        (
            async_scheduler.AsyncScheduler,
            "_update_after_schedule",
            AFTER_SCHEDULE,
            _wrap_after_schedule,
        ),
    ]


def _rewind_targets() -> list[Install]:
    from vllm.v1.core.sched import scheduler
    from vllm.v1.worker.gpu import model_runner

    sched = scheduler.Scheduler
    return [
        (sched, "_handle_invalid_blocks", HANDLE, _wrap_handle_rewind),
        (sched, "schedule", SCHEDULE, _wrap_schedule),
        (model_runner.GPUModelRunner, "update_requests", RUNNER_UPDATE, _wrap_runner_update),
    ]


def apply_inflight() -> Outcome:
    """Make a failed KV load drop the async step in flight, unless that is upstream."""
    return _apply(
        "kv_async_inflight",
        inflight_rule,
        (HANDLE, UPDATE_INVALID),
        _inflight_targets,
        "a failed KV load drops the async step in flight ({why}); acts only with async scheduling",
    )


def apply_rewind() -> Outcome:
    """Make the V2 runner apply the scheduler's rewind, unless that is upstream."""
    return _apply(
        "kv_rewind_v2",
        rewind_rule,
        (HANDLE, RUNNER_UPDATE),
        _rewind_targets,
        "the V2 runner applies a KV-failure rewind ({why}); acts only on an engine that runs it",
    )


def revert() -> None:
    """Undo both patches in this process (tests), innermost last."""
    ORIGINALS.restore()


_WATCH_SCHED = (
    f"{SCHED}:Scheduler._update_requests_with_invalid_blocks",
    "vllm.v1.request:Request",
)

PATCHES = (
    declare(
        "kv_async_inflight",
        versions="vLLM without PR 49252 (0.26-0.34: the failure path keeps in-flight async output)",
        reason="issue 49250 / PR 49252: with async scheduling the step in flight over a "
        "failed KV load was kept; its frames are now dropped as a preemption's are",
        apply=apply_inflight,
        roles=("engine_core",),
        verified_on=("0.26.0", "0.32.0"),
        symbols=(HANDLE, UPDATE_INVALID, UPDATE_FROM_OUTPUT, AFTER_SCHEDULE),
        watch=_WATCH_SCHED,
        upstream=inflight_rule,
        attributes=(
            "vllm.v1.request:Request.num_output_placeholders",
            # 0.26 drops frames with async_tokens_to_discard, 0.32+ with stale output
            "vllm.v1.request:Request.async_tokens_to_discard|num_stale_output_tokens",
            "vllm.v1.request:Request.num_in_flight_tokens",
            f"{SCHED}:Scheduler.requests",
            f"{SCHED}:Scheduler.recompute_kv_load_failures",
        ),
    ),
    declare(
        "kv_rewind_v2",
        target=dotted(RUNNER_UPDATE),
        versions="vLLM with the V2 model runner, without PR 53298 (0.26-0.34)",
        reason="issue 49250 / PRs 49252, 53298: the V2 model runner ignored the scheduler's "
        "rewind after a failed KV load; the device count, total_len and bin counts now follow it",
        apply=apply_rewind,
        roles=("engine_core", "worker"),
        # 0.26.0: on the H200 (docs/gpu.md); 0.32.0: the scheduler half on its real
        # AsyncScheduler, the runner half on stand-ins (the CPU build cannot run the V2
        # runner; its update_requests is 0.26's, line for line)
        verified_on=("0.26.0", "0.32.0"),
        symbols=(HANDLE, SCHEDULE, RUNNER_UPDATE),
        watch=(*_WATCH_SCHED, "vllm.v1.worker.gpu.states:RequestState"),
        upstream=rewind_rule,
        attributes=(
            "vllm.v1.request:Request.status",
            f"{SCHED}:Scheduler.requests",
            "vllm.v1.core.sched.output:CachedRequestData.num_output_tokens",
            "vllm.v1.core.sched.output:CachedRequestData.num_computed_tokens",
            *(
                f"vllm.v1.worker.gpu.states:RequestState.{a}"
                for a in (
                    "num_computed_tokens",
                    "total_len",
                    "prompt_len",
                    "all_token_ids",
                    "req_id_to_index",
                )
            ),
            f"{V2}:GPUModelRunner.req_states",
            f"{V2}:GPUModelRunner.sampler",
            "vllm.v1.worker.gpu.sample.penalties:PenaltiesState.output_bin_counts",
        ),
    ),
)
