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

Warm-up and dummy runs call the sampler directly, not ``_sample``, so they are not
recorded. Rows of a partially prefilled request (sampled then discarded) are recorded
in ``num_reqs`` but do not advance that request's output position.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from engine_patches import knobs
from engine_patches.patch import symbols
from engine_patches.registry import (
    APPLIED,
    SKIPPED,
    Outcome,
    Patch,
    platform_name,
    process_role,
    record_event,
)

PROBE_NAME = "batch"
ENV_PROBES = "OPSCTL_PROBES"
ENV_NUDGE = knobs.NUDGE
RECORDED_ENV = ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_BATCH_INVARIANT")
DEFAULT_DELTA = 0.01
MAX_TRACKED = 4096

ORIGINALS: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Nudge:
    marker: str
    position: int
    delta: float = DEFAULT_DELTA


def requested(env: dict[str, str] | None = None) -> bool:
    raw = (env if env is not None else os.environ).get(ENV_PROBES, "")
    return PROBE_NAME in {p.strip() for p in raw.split(",")}


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
    """The nudge this process was armed with: only an explicitly enabled test knob
    (``knobs.get``), never a bare ``OPSCTL_PROBE_NUDGE`` inherited from a shell."""
    return parse_nudge(knobs.get(ENV_NUDGE))


def item_identifiers(state) -> list[str]:
    """The identifiers of a request's multimodal items (its images' uuids, or the
    engine's own ids for items sent without one); [] for a text-only request."""
    return [str(getattr(f, "identifier", "")) for f in getattr(state, "mm_features", None) or ()]


def encoder_items(runner, scheduler_output) -> dict[str, int]:
    """Request id -> multimodal items with data this encoder call runs (what
    ``_batch_mm_inputs_from_scheduler`` batches); {} when none."""
    out: dict[str, int] = {}
    for req_id, input_ids in (
        getattr(scheduler_output, "scheduled_encoder_inputs", None) or {}
    ).items():
        state = runner.requests.get(req_id)
        features = getattr(state, "mm_features", None) or []
        n = sum(1 for i in input_ids if i < len(features) and features[i].data is not None)
        if n:
            out[str(req_id)] = n
    return out


class _Tracker:
    """Per-process state: output positions and marker matches per request id."""

    def __init__(self, nudge: Nudge | None, tokenizer_path: str | None) -> None:
        self.nudge = nudge
        self.tokenizer_path = tokenizer_path
        self._tokenizer: Any = None
        self.positions: dict[str, int] = {}
        self.matches: dict[str, bool] = {}
        self.steps = 0

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
            state = runner.requests.get(req_id) if not hit else None
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


def observe(tracker: _Tracker, runner, logits) -> None:
    """Record this sampling step; apply the nudge when it is due. Never raises out."""
    if logits is None:
        return
    rows = int(logits.shape[0])
    req_ids = [r for r in list(runner.input_batch.req_ids)[:rows] if r is not None]
    n = len(req_ids)
    tracker.steps += 1
    record_event(
        "batch", {"event": "step", "step": tracker.steps, "num_reqs": n, "req_ids": req_ids}
    )
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    nudge = tracker.nudge
    for row, rid in enumerate(req_ids):
        discarded = bool(mask[row]) if mask is not None and row < len(mask) else False
        if discarded:
            continue
        pos = tracker.positions.get(rid, 0)
        tracker.positions[rid] = pos + 1
        if nudge is None or n < 2 or pos != nudge.position:
            continue
        if not tracker.matches_marker(runner, rid):
            continue
        top = int(logits[row].argmax().item())
        logits[row, top] += nudge.delta
        record_event(
            "batch",
            {
                "event": "nudge",
                "req_id": rid,
                "position": pos,
                "token_id": top,
                "delta": nudge.delta,
                "num_reqs": n,
            },
        )
    tracker.prune(req_ids)


def _wrap_encoder(original):
    """Record which requests' items one encoder call runs; never changes the call."""

    @functools.wraps(original)
    def _execute_mm_encoder(self, scheduler_output, *args, **kwargs):
        try:
            items = encoder_items(self, scheduler_output)
            if items:
                record_event("batch", {"event": "encoder", "items": items})
        except Exception as exc:  # a probe never breaks the engine
            record_event("batch", {"event": "error", "error": repr(exc)})
        return original(self, scheduler_output, *args, **kwargs)

    _execute_mm_encoder._opsctl_batch_probe = True  # type: ignore[attr-defined]
    return _execute_mm_encoder


def _install_encoder(cls) -> str:
    """Wrap the encoder call when this vLLM has it (multimodal models call it)."""
    current = getattr(cls, "_execute_mm_encoder", None)
    if current is None:
        return "; no _execute_mm_encoder in this vLLM: encoder calls not recorded"
    if not getattr(current, "_opsctl_batch_probe", False):
        ORIGINALS["_execute_mm_encoder"] = current
        cls._execute_mm_encoder = _wrap_encoder(current)
    return "; records vision encoder calls"


def apply() -> Outcome:
    if not requested():
        return Outcome(SKIPPED, f"inert: {ENV_PROBES} does not contain {PROBE_NAME!r}")
    nudge = armed_nudge()
    env = {k: os.environ.get(k) for k in RECORDED_ENV}
    init = {
        "event": "init",
        "role": process_role(),
        "platform": platform_name(),
        "env": env,
        "nudge": None
        if nudge is None
        else {"marker": nudge.marker, "position": nudge.position, "delta": nudge.delta},
    }
    record_event("batch", init)
    try:
        from vllm.v1.worker import gpu_model_runner as gmr
    except ImportError:  # vLLM >= 0.34: the V1 model runner is gone (V2 runners only)
        return Outcome(
            SKIPPED,
            "no vllm.v1.worker.gpu_model_runner in this vLLM (V2 model runner, not "
            "supported yet): formed batches are not recorded",
        )
    cls = gmr.GPUModelRunner
    if getattr(cls, "_sample", None) is None:
        return Outcome(SKIPPED, "GPUModelRunner._sample not in this vLLM: batches not recorded")
    if getattr(cls._sample, "_opsctl_batch_probe", False):
        return Outcome(APPLIED, "already applied in this process")
    original = cls._sample
    ORIGINALS["_sample"] = original
    trackers: dict[int, _Tracker] = {}

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        try:
            tracker = trackers.get(id(self))
            if tracker is None:
                path = getattr(getattr(self.vllm_config, "model_config", None), "tokenizer", None)
                tracker = trackers[id(self)] = _Tracker(nudge, path)
            observe(tracker, self, logits)
        except Exception as exc:  # a probe never breaks the engine
            record_event("batch", {"event": "error", "error": repr(exc)})
        return original(self, logits, spec_decode_metadata)

    _sample._opsctl_batch_probe = True  # type: ignore[attr-defined]
    cls._sample = _sample  # type: ignore[method-assign]
    detail = "records formed batches into events/batch.jsonl" + _install_encoder(cls)
    if nudge is not None:
        detail += f"; TEST NUDGE active: {nudge}"
    return Outcome(APPLIED, detail)


def undo() -> None:
    """Restore the original ``_sample`` and encoder call (tests)."""
    from vllm.v1.worker import gpu_model_runner as gmr

    for name in ("_sample", "_execute_mm_encoder"):
        if name in ORIGINALS:
            setattr(gmr.GPUModelRunner, name, ORIGINALS.pop(name))


PATCH = Patch(
    name="batch_probe",
    target="vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample, ._execute_mm_encoder",
    versions="any (needs GPUModelRunner._sample(logits, spec_decode_metadata))",
    reason="opsctl probe for diag invariance: show the batch the engine formed (PR 56528)",
    apply=apply,
    roles=("engine_core", "worker"),
    verified_on=("0.32.0",),
    symbols=symbols(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner._sample",
        "GPUModelRunner._execute_mm_encoder",
    ),
    watch=symbols("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample"),
    kind="probe",
)
