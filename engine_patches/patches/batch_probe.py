"""Probe: record the batches the model runner really forms, for `opsctl diag invariance`.

Inert unless ``OPSCTL_PROBES`` (comma-separated) contains ``batch``; then it reports
"skipped" in the ledger with that reason. When requested it wraps
``GPUModelRunner._sample`` (CPUModelRunner inherits it) and appends to
``<run>/events/batch.jsonl``:

- one ``{"event": "init", ...}`` line per process: role, the sampler-relevant env vars
  as this process sees them (``VLLM_USE_FLASHINFER_SAMPLER``, ``VLLM_BATCH_INVARIANT``)
  and the nudge spec, so opsctl can show those settings reached the engine;
- one ``{"event": "step", "num_reqs": n, "req_ids": [...]}`` line per sampling step:
  the batch the scheduler formed and the model runner sampled;
- on a multimodal model, one ``{"event": "encoder", "items": {req_id: n}}`` line per
  call of the vision encoder (``GPUModelRunner._execute_mm_encoder``): how many
  multimodal items (with data) of which requests ran the encoder together in that
  step, i.e. that the images reached the model and whose were encoded in one batch.

Test-only knob ``OPSCTL_PROBE_NUDGE="<marker>:<position>[:<delta>]"`` (read through
:mod:`engine_patches.knobs`, so honoured only with ``OPSCTL_TEST_KNOBS=1``, which opsctl
sets only for knobs a caller asked for explicitly): for a request
whose id, decoded prompt or multimodal item identifier (an image's ``uuid``) contains
``<marker>``, add ``<delta>`` (default 0.01) to the
largest logit at output position ``<position>`` (0-based) -- but only when that step
samples more than one request. The token stays the same and its logprobs move, so a
divergence between BS=1 and BS=N is planted at a known prompt and position. Each nudge
is recorded as ``{"event": "nudge", ...}``.

Two model runners, resolved by symbol (never by version number):

- V1 (``vllm.v1.worker.gpu_model_runner``; vLLM <= 0.33, and the CPU runner, which
  inherits it): ``GPUModelRunner._sample(logits, spec_decode_metadata)`` and
  ``._execute_mm_encoder``, as above;
- V2 (``vllm.v1.worker.gpu.model_runner``, CUDA's default since 0.26; the only one
  from 0.34): ``GPUModelRunner.sample(hidden_states, input_batch, grammar_output)``
  is the sampling step (``input_batch.req_ids`` is the batch). Its logits are made
  inside it and handed to ``self.sampler(logits, input_batch)``, so the nudge is
  applied by a stand-in sampler for the duration of that one call (not on the
  speculative-decoding path, which calls ``rejection_sampler``: the ledger says so).
  Encoder calls are read around ``execute_model`` from ``scheduled_encoder_inputs``
  and the runner's ``encoder_cache.mm_features`` (V2 has no encoder method of the
  runner to wrap); the nudge's marker is matched against prompts and image uuids
  captured by ``add_requests``. Rows still prefilling (``input_batch.is_prefilling_np``)
  do not advance a request's output position.

The init event names the runner hooked (``"runner": "v1"|"v2"``; null, with
``hooked``, when this vLLM has both and the worker picks one at start); the first
sampling step of each process also records ``{"event": "runner", "runner": ...}``,
the runner that really ran. When neither runner's target exists the probe is skipped
with "cannot see batches on this vLLM", never a silent no-op.

Warm-up and dummy runs call the sampler directly, not ``_sample``/``sample``, so they
are not recorded. Rows of a partially prefilled request (sampled then discarded) are recorded
in ``num_reqs`` but do not advance that request's output position.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from engine_patches import knobs, wrapping
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe, symbols
from engine_patches.records import platform_name, process_role, record_event
from engine_patches.wrapping import Originals

PROBE_NAME = "batch"
ENV_PROBES = wrapping.PROBES
ENV_NUDGE = knobs.NUDGE
RECORDED_ENV = ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_BATCH_INVARIANT")
DEFAULT_DELTA = 0.01
MAX_TRACKED = 4096

ORIGINALS = Originals()
MARK = "_opsctl_batch_probe"


@dataclass(frozen=True, slots=True)
class Nudge:
    """A planted logit nudge: where (request marker, output position) and how much."""

    marker: str
    position: int
    delta: float = DEFAULT_DELTA


def requested(env: dict[str, str] | None = None) -> bool:
    """Whether ``OPSCTL_PROBES`` names this probe."""
    return wrapping.requested(PROBE_NAME, env)


def parse_nudge(spec: str | None) -> Nudge | None:
    """``"<marker>:<position>[:<delta>]"`` -> Nudge; empty -> None; malformed -> ValueError."""
    if not spec:
        return None
    parts = spec.split(":")
    marker, position, delta = "", -1, DEFAULT_DELTA
    try:
        if len(parts) >= 3:
            try:
                marker, position, delta = ":".join(parts[:-2]), int(parts[-2]), float(parts[-1])
            except ValueError:
                marker, position = ":".join(parts[:-1]), int(parts[-1])
        elif len(parts) == 2:
            marker, position = parts[0], int(parts[1])
    except ValueError:
        raise ValueError(f"{ENV_NUDGE}: position in {spec!r} is not an integer") from None
    if not marker or position < 0:
        raise ValueError(
            f"{ENV_NUDGE} must be '<marker>:<position>[:<delta>]' (position >= 0), not {spec!r}"
        )
    return Nudge(marker, position, delta)


def armed_nudge() -> Nudge | None:
    """The nudge this process was armed with, or None.

    Only an explicitly enabled test knob (``knobs.get``) arms it, never a bare
    ``OPSCTL_PROBE_NUDGE`` inherited from a shell."""
    return parse_nudge(knobs.get(ENV_NUDGE))


def item_identifiers(state) -> list[str]:
    """The identifiers of a request's multimodal items.

    Its images' uuids, or the engine's own ids for items sent without one; [] for a
    text-only request."""
    return [str(getattr(f, "identifier", "")) for f in getattr(state, "mm_features", None) or ()]


def _items_with_data(scheduled, features_of) -> dict[str, int]:
    """Request id -> how many of its scheduled encoder inputs are items with data
    (``features_of(req_id)``: the request's multimodal features); {} when none."""
    out: dict[str, int] = {}
    for req_id, input_ids in (scheduled or {}).items():
        features = features_of(req_id) or []
        n = sum(1 for i in input_ids if i < len(features) and features[i].data is not None)
        if n:
            out[str(req_id)] = n
    return out


def encoder_items(runner, scheduler_output) -> dict[str, int]:
    """V1: request id -> multimodal items with data this encoder call runs.

    What ``_batch_mm_inputs_from_scheduler`` batches; {} when none."""
    return _items_with_data(
        getattr(scheduler_output, "scheduled_encoder_inputs", None),
        lambda req_id: getattr(runner.requests.get(req_id), "mm_features", None),
    )


def _error(exc: Exception) -> None:
    """Record what went wrong in the probe (a probe never breaks the engine)."""
    record_event("batch", {"event": "error", "error": repr(exc)})


class _Tracker:
    """Per-process state: output positions and marker matches per request id."""

    def __init__(self, nudge: Nudge | None, tokenizer_path: str | None) -> None:
        self.nudge = nudge
        self.tokenizer_path = tokenizer_path
        self._tokenizer: Any = None
        self.positions: dict[str, int] = {}
        self.matches: dict[str, bool] = {}
        self.states: dict[str, Any] = {}  # V2: req id -> new request data (prompt, mm)
        self.steps = 0
        self.runner_recorded = False

    def _decode(self, token_ids) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return str(self._tokenizer.decode(list(token_ids)))

    def matches_marker(self, runner, req_id: str) -> bool:
        assert self.nudge is not None
        if req_id not in self.matches:
            marker = self.nudge.marker
            hit = marker in req_id
            state = None
            if not hit:  # V2: captured by add_requests; V1: the runner's own states
                state = self.states.get(req_id) or (getattr(runner, "requests", None) or {}).get(
                    req_id
                )
            if state is not None:
                hit = any(marker in ident for ident in item_identifiers(state))
            if state is not None and not hit:
                ids = getattr(state, "prompt_token_ids", None)
                hit = bool(ids) and marker in self._decode(ids)
            self.matches[req_id] = hit
        return self.matches[req_id]

    def prune(self, live: list[str]) -> None:
        if len(self.positions) > MAX_TRACKED:
            keep = set(live)
            self.positions = {k: v for k, v in self.positions.items() if k in keep}
            self.matches = {k: v for k, v in self.matches.items() if k in keep}
            self.states = {k: v for k, v in self.states.items() if k in keep}


def record_step(tracker: _Tracker, runner, req_ids: list[str], discarded) -> list[tuple[str, int]]:
    """Record one sampling step; the (req id, position) pairs the nudge is due on.

    ``req_ids``: the batch, in row order; each kept row's output position advances."""
    n = len(req_ids)
    tracker.steps += 1
    record_event(
        "batch", {"event": "step", "step": tracker.steps, "num_reqs": n, "req_ids": req_ids}
    )
    nudge, due = tracker.nudge, []
    for row, rid in enumerate(req_ids):
        if discarded is not None and row < len(discarded) and bool(discarded[row]):
            continue
        pos = tracker.positions.get(rid, 0)
        tracker.positions[rid] = pos + 1
        if nudge is None or n < 2 or pos != nudge.position:
            continue
        if tracker.matches_marker(runner, rid):
            due.append((rid, pos))
    tracker.prune(req_ids)
    return due


def nudge_rows(tracker: _Tracker, logits, rows: dict[str, int], due, num_reqs: int) -> None:
    """Nudge the largest logit of each due request's row and record each nudge.

    ``rows``: req id -> logits row; the nudge adds its delta."""
    nudge = tracker.nudge
    assert nudge is not None
    for rid, pos in due:
        row = rows.get(rid)
        if row is None or row >= int(logits.shape[0]):
            continue
        top = int(logits[row].argmax().item())
        before = float(logits[row, top].item())
        logits[row, top] += nudge.delta
        record_event(
            "batch",
            {
                "event": "nudge",
                "req_id": rid,
                "position": pos,
                "token_id": top,
                "delta": nudge.delta,
                # what the logits' dtype kept of the delta (0.0: lost to its precision)
                "applied": float(logits[row, top].item()) - before,
                "num_reqs": num_reqs,
            },
        )


def _record_runner(tracker: _Tracker, runner, name: str) -> None:
    """Once per process and runner: which model runner really sampled."""
    if not tracker.runner_recorded:
        tracker.runner_recorded = True
        record_event("batch", {"event": "runner", "runner": name, "class": type(runner).__name__})


def observe(tracker: _Tracker, runner, logits) -> None:
    """V1: record this sampling step; apply the nudge when it is due. Never raises out."""
    if logits is None:
        return
    _record_runner(tracker, runner, "v1")
    rows = int(logits.shape[0])
    req_ids = [r for r in list(runner.input_batch.req_ids)[:rows] if r is not None]
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    due = record_step(tracker, runner, req_ids, mask)
    if due:
        nudge_rows(tracker, logits, {r: i for i, r in enumerate(req_ids)}, due, len(req_ids))


class _NudgingSampler:
    """V2: stands in for ``runner.sampler`` during one ``sample`` call; nudges the
    due rows of the logits it is handed, then samples with the real sampler."""

    def __init__(self, inner, tracker: _Tracker, due, num_reqs: int) -> None:
        self._inner, self._tracker, self._due, self._num_reqs = inner, tracker, due, num_reqs

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, logits, input_batch, *args, **kwargs):
        try:
            ids = list(input_batch.req_ids)[: int(input_batch.num_reqs)]
            if int(logits.shape[0]) == len(ids):  # one logits row per request (no drafts)
                rows = {r: i for i, r in enumerate(ids)}
                if any(r in rows for r, _ in self._due) and logits.element_size() < 4:
                    # V2 keeps the model's dtype (bf16 on a GPU): a 0.01 delta on a logit
                    # of ~10 rounds away (seen on the H200); the sampler upcasts anyway
                    logits = logits.float()
                nudge_rows(self._tracker, logits, rows, self._due, self._num_reqs)
        except Exception as exc:  # a probe never breaks the engine
            _error(exc)
        return self._inner(logits, input_batch, *args, **kwargs)


def observe_v2(tracker: _Tracker, runner, input_batch) -> list[tuple[str, int]]:
    """V2: record the step ``input_batch`` samples; the pairs due for the nudge.

    The pairs are (req id, output position)."""
    _record_runner(tracker, runner, "v2")
    n = int(input_batch.num_reqs)
    req_ids = [str(r) for r in list(input_batch.req_ids)[:n] if r is not None]
    return record_step(tracker, runner, req_ids, getattr(input_batch, "is_prefilling_np", None))


def encoder_items_v2(runner, scheduled: dict) -> dict[str, int]:
    """V2: request id -> multimodal items with data one step's encoder runs.

    Read from the runner's encoder cache (``encoder_cache.mm_features``); {} when
    none."""
    features_of = getattr(getattr(runner, "encoder_cache", None), "mm_features", None) or {}
    return _items_with_data(scheduled, features_of.get)


def _wrap_encoder(original):
    """Record which requests' items one encoder call runs; never changes the call."""

    @functools.wraps(original)
    def _execute_mm_encoder(self, scheduler_output, *args, **kwargs):
        try:
            items = encoder_items(self, scheduler_output)
            if items:
                record_event("batch", {"event": "encoder", "items": items})
        except Exception as exc:  # a probe never breaks the engine
            _error(exc)
        return original(self, scheduler_output, *args, **kwargs)

    return _execute_mm_encoder


def _install_encoder(cls) -> str:
    """Wrap the encoder call when this vLLM has it (multimodal models call it)."""
    if getattr(cls, "_execute_mm_encoder", None) is None:
        return "; no _execute_mm_encoder in this vLLM: encoder calls not recorded"
    _install(cls, "_execute_mm_encoder", _wrap_encoder, "v1")
    return "; records vision encoder calls"


V1_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_MODULE = "vllm.v1.worker.gpu.model_runner"
_TRACKERS: dict[int, _Tracker] = {}


def _tracker(runner, nudge: Nudge | None) -> _Tracker:
    tracker = _TRACKERS.get(id(runner))
    if tracker is None:
        path = getattr(getattr(runner.vllm_config, "model_config", None), "tokenizer", None)
        tracker = _TRACKERS[id(runner)] = _Tracker(nudge, path)
    return tracker


def _install(cls, attr: str, wrapper, runner: str) -> None:
    """Wrap ``cls.attr`` of the ``runner`` (v1 | v2) once."""
    ORIGINALS.wrap(cls, attr, wrapper, MARK, key=f"{runner}.{attr}")


def hook_v1(cls, nudge: Nudge | None) -> str:
    """Wrap the V1 runner's ``_sample`` (and encoder call); what it records."""

    def wrap(original):
        @functools.wraps(original)
        def _sample(self, logits, spec_decode_metadata):
            try:
                observe(_tracker(self, nudge), self, logits)
            except Exception as exc:  # a probe never breaks the engine
                _error(exc)
            return original(self, logits, spec_decode_metadata)

        return _sample

    _install(cls, "_sample", wrap, "v1")
    return "V1 runner: formed batches" + _install_encoder(cls)


def hook_v2(cls, nudge: Nudge | None) -> str:
    """Wrap the V2 runner's methods the probe records from; what it records.

    ``sample`` (steps, nudge), ``execute_model`` (encoder calls) and, with a nudge,
    ``add_requests`` (prompts and uuids for its marker)."""

    def wrap_sample(original):
        @functools.wraps(original)
        def sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
            due: list = []
            try:
                tracker = _tracker(self, nudge)
                due = observe_v2(tracker, self, input_batch)
            except Exception as exc:  # a probe never breaks the engine
                _error(exc)
            inner = getattr(self, "sampler", None)
            if not due or inner is None:
                return original(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
            self.sampler = _NudgingSampler(inner, tracker, due, int(input_batch.num_reqs))
            try:
                return original(self, hidden_states, input_batch, grammar_output, *args, **kwargs)
            finally:
                self.sampler = inner

        return sample

    def wrap_execute(original):
        @functools.wraps(original)
        def execute_model(self, scheduler_output, *args, **kwargs):
            out = original(self, scheduler_output, *args, **kwargs)
            try:  # after the call: add_requests has filled the encoder cache
                scheduled = getattr(scheduler_output, "scheduled_encoder_inputs", None)
                items = encoder_items_v2(self, scheduled) if scheduled else {}
                if items:
                    record_event("batch", {"event": "encoder", "items": items})
            except Exception as exc:  # a probe never breaks the engine
                _error(exc)
            return out

        return execute_model

    def wrap_add(original):
        @functools.wraps(original)
        def add_requests(self, scheduler_output, *args, **kwargs):
            try:
                tracker = _tracker(self, nudge)
                for new in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
                    tracker.states[str(new.req_id)] = new
            except Exception as exc:  # a probe never breaks the engine
                _error(exc)
            return original(self, scheduler_output, *args, **kwargs)

        return add_requests

    _install(cls, "sample", wrap_sample, "v2")
    detail = "V2 runner: formed batches"
    if getattr(cls, "execute_model", None) is not None:
        _install(cls, "execute_model", wrap_execute, "v2")
        detail += "; records vision encoder calls (from scheduled_encoder_inputs)"
    if nudge is not None:
        if getattr(cls, "add_requests", None) is not None:
            _install(cls, "add_requests", wrap_add, "v2")
        detail += "; nudge through self.sampler (not on the speculative-decoding path)"
    return detail


def _runner_class(module: str, method: str) -> tuple[Any, str | None]:
    """(``module.GPUModelRunner`` when it has ``method``, else None; why not)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # V2 imports CUDA-only code; absent in some releases
        return None, f"{module} not importable ({type(exc).__name__}: {exc})"[:300]
    cls = getattr(mod, "GPUModelRunner", None)
    if cls is None or getattr(cls, method, None) is None:
        return None, f"{module}.GPUModelRunner.{method} not in this vLLM"
    return cls, None


def apply() -> Outcome:
    """Hook the model runner(s) this vLLM has, when the probe is requested."""
    if not requested():
        return Outcome(SKIPPED, f"inert: {ENV_PROBES} does not contain {PROBE_NAME!r}")
    nudge = armed_nudge()
    v1, why_v1 = _runner_class(V1_MODULE, "_sample")
    v2 = None
    why_v2: str | None = "CPUModelRunner is the V1 runner"
    if v1 is None or platform_name() != "cpu":  # CPU's worker never runs V2 when V1 exists
        v2, why_v2 = _runner_class(V2_MODULE, "sample")
    hooked = [name for name, cls in (("v1", v1), ("v2", v2)) if cls is not None]
    record_event(
        "batch",
        {
            "event": "init",
            "role": process_role(),
            "platform": platform_name(),
            "env": {k: os.environ.get(k) for k in RECORDED_ENV},
            "nudge": None
            if nudge is None
            else {"marker": nudge.marker, "position": nudge.position, "delta": nudge.delta},
            "runner": hooked[0] if len(hooked) == 1 else None,
            "hooked": hooked,
        },
    )
    if not hooked:
        return Outcome(
            SKIPPED,
            f"cannot see batches on this vLLM: {why_v1}; {why_v2}: formed batches are not recorded",
        )
    parts = []
    if v1 is not None:
        parts.append(hook_v1(v1, nudge))
    if v2 is not None:
        parts.append(hook_v2(v2, nudge))
    detail = "records formed batches into events/batch.jsonl; " + "; ".join(parts)
    if nudge is not None:
        detail += f"; TEST NUDGE active: {nudge}"
    return Outcome(APPLIED, detail)


def undo() -> None:
    """Restore every wrapped method of either runner (tests)."""
    ORIGINALS.restore()
    _TRACKERS.clear()


PATCH = probe(
    "batch_probe",
    target="V1 vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample, "
    "._execute_mm_encoder; V2 vllm.v1.worker.gpu.model_runner.GPUModelRunner.sample, "
    ".execute_model, .add_requests",
    versions="any with V1 GPUModelRunner._sample(logits, spec_decode_metadata) or V2 "
    "GPUModelRunner.sample(hidden_states, input_batch, grammar_output)",
    reason="opsctl probe for diag invariance: show the batch the engine formed (PR 56528)",
    apply=apply,
    roles=("engine_core", "worker"),
    symbols=symbols(
        V1_MODULE,
        "GPUModelRunner._sample",
        "GPUModelRunner._execute_mm_encoder",
    ),
    # the V2 runner (CUDA since vLLM 0.26; the only one in 0.34): its sample and
    # execute_model where V1's are gone, and add_requests (the nudge's markers)
    alternatives=(
        (f"{V1_MODULE}:GPUModelRunner._sample", f"{V2_MODULE}:GPUModelRunner.sample"),
        (
            f"{V1_MODULE}:GPUModelRunner._execute_mm_encoder",
            f"{V2_MODULE}:GPUModelRunner.execute_model",
        ),
    ),
    watch=symbols(V2_MODULE, "GPUModelRunner.add_requests"),
)
