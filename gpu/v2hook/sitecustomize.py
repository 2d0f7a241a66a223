"""Trace (and optionally fix) vLLM's V2 model runner's handling of a KV-load rewind.

Put this folder first on ``PYTHONPATH`` of a vLLM engine and set ``OPSCTL_GPU_V2``:

- ``trace``: after the runner applied a step's scheduler output (``update_requests``),
  compare, for every scheduled cached request, the scheduler's ``num_computed_tokens``
  with the runner's own device-side count (``req_states.num_computed_tokens.gpu``, the
  one ``prepare_inputs`` builds positions, input ids and slot mappings from). Every
  mismatch is recorded, with the positions the following forward actually computes
  for that request.
- ``fix``: the same, and the device-side count is set to the scheduler's before the
  forward (what the V1 runner does through ``input_batch.num_computed_tokens_cpu``).

Records: one JSON line per event on stderr (prefix ``OPSCTL_V2TRACE``, so it lands in
the engine's server.log) and in ``$OPSCTL_RUN_DIR/events/gpu_v2_trace.jsonl``.

Nothing happens unless ``OPSCTL_GPU_V2`` is set, and nothing is imported until vLLM
imports ``vllm.v1.worker.gpu.model_runner`` (only the V2 runner's module is patched).
Diagnostic tool for the H200 runs (docs/gpu.md); never loaded by opsctl itself.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import time

_MODE = os.environ.get("OPSCTL_GPU_V2", "")
_TARGET = "vllm.v1.worker.gpu.model_runner"


def _record(event: dict) -> None:
    event = {"t": round(time.time(), 3), "pid": os.getpid(), **event}
    line = json.dumps(event, sort_keys=True)
    print(f"OPSCTL_V2TRACE {line}", file=sys.stderr, flush=True)
    run = os.environ.get("OPSCTL_RUN_DIR")
    if run:
        try:
            os.makedirs(os.path.join(run, "events"), exist_ok=True)
            with open(os.path.join(run, "events", "gpu_v2_trace.jsonl"), "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def _patch(module) -> None:
    cls = module.GPUModelRunner
    fix = "fix" in _MODE
    orig_update = cls.update_requests
    orig_prepare = cls.prepare_inputs

    def update_requests(self, scheduler_output):
        orig_update(self, scheduler_output)
        if not getattr(self, "_opsctl_active", False):
            self._opsctl_active = True
            _record({"event": "v2_runner_active", "class": type(self).__name__})
        reqs = scheduler_output.scheduled_cached_reqs
        self._opsctl_watch = {}
        if not reqs.req_ids:
            return
        rs = self.req_states
        idx = [rs.req_id_to_index[r] for r in reqs.req_ids]
        device = rs.num_computed_tokens.gpu[idx].tolist()  # a sync: diagnostics only
        for req_id, i, sched, dev in zip(
            reqs.req_ids, idx, reqs.num_computed_tokens, device, strict=True
        ):
            if int(sched) == int(dev):
                continue
            self._opsctl_watch[req_id] = int(sched)
            _record(
                {
                    "event": "mismatch",
                    "req_id": req_id,
                    "scheduler_num_computed_tokens": int(sched),
                    "runner_device_num_computed_tokens": int(dev),
                    "runner_cpu_mirror": int(rs.num_computed_tokens_np[i]),
                    "prefill_len": int(rs.prefill_len.np[i]),
                    "scheduled_tokens": int(scheduler_output.num_scheduled_tokens.get(req_id, 0)),
                    "fixed": fix,
                }
            )
            if fix:
                rs.num_computed_tokens.gpu[i] = int(sched)

    def prepare_inputs(self, scheduler_output, batch_desc):
        batch = orig_prepare(self, scheduler_output, batch_desc)
        watch = getattr(self, "_opsctl_watch", None) or {}
        for b, req_id in enumerate(batch.req_ids):
            if req_id not in watch:
                continue
            start, end = int(batch.query_start_loc_np[b]), int(batch.query_start_loc_np[b + 1])
            pos = batch.positions[start:end].tolist()
            _record(
                {
                    "event": "forward_positions",
                    "req_id": req_id,
                    "scheduler_num_computed_tokens": watch[req_id],
                    "first_position": pos[0] if pos else None,
                    "last_position": pos[-1] if pos else None,
                    "tokens": len(pos),
                }
            )
        return batch

    cls.update_requests = update_requests
    cls.prepare_inputs = prepare_inputs
    _record({"event": "patched", "mode": _MODE, "class": f"{cls.__module__}.{cls.__name__}"})


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                _patch(module)
            except Exception as exc:  # diagnostics must never stop the engine
                _record({"event": "patch_error", "error": repr(exc)})

        loader.exec_module = exec_and_patch
        return spec


if _MODE:
    sys.meta_path.insert(0, _Finder())
