"""Probe and planted fault for ``opsctl diag lora`` (vLLM PR 55897).

PR 55897 is LoRA on multimodal towers: are mixed-adapter batches mapped request by
request?

Probe, inert unless ``OPSCTL_PROBES`` (comma-separated) contains ``lora``: in the worker
it appends to ``<run>/events/lora.jsonl``

- ``{"event": "manager", ...}`` once the LoRA model manager exists: whether the model is
  multimodal for LoRA, whether tower/connector LoRA is on (the engine's own
  ``supports_tower_connector_lora`` after its checks), the punica wrapper class, the
  modules wrapped with LoRA per part (language model / tower / connector, from the
  model's ``get_mm_mapping()``), max_loras, max_lora_rank and the compilation mode;
- ``{"event": "adapter", ...}`` per adapter loaded: its name, id, and per part the
  modules the adapter carries and how many of them the engine wrapped (an adapter's
  weights for a module the engine did not wrap are silently unused); on vLLM >= 0.33 a
  text-only adapter's ``model.layers.*`` names count for a multimodal model's language
  model, as that vLLM applies them there (``text_only``: how many);
- ``{"event": "encoder", "req_ids", "lora_ids"}`` per vision encoder call
  (``GPUModelRunner._execute_mm_encoder``): whose images ran the tower together, with
  which adapters (0: none).

On vLLM's V2 model runner (``vllm.v1.worker.gpu``: CUDA's default since 0.26, the only
runner from 0.34) the same records and swaps come from V2's own LoRA code: the encoder
event from ``set_active_mm_loras`` (the function the V2 runner calls, by the name it
imported, before every vision encoder pass; ``lora_state.lora_ids`` holds each request's
adapter), the language-model swap in ``LoraState.make_lora_inputs(req_ids, idx_mapping,
num_scheduled_tokens)``, the tower swap around ``set_active_mm_loras``. On the CPU
platform, whose runner is the V1 one, only V1 is hooked. When neither runner's hooks
exist the ledger says what is not observable (encoder calls, swaps).

Test-only knob ``OPSCTL_LORA_SWAP`` (read through :mod:`engine_patches.knobs`, so
honoured only with ``OPSCTL_TEST_KNOBS=1``), value ``lm`` | ``tower`` | ``all`` (any
other non-empty value: ``all``): when a step of the model runner holds two requests
with two different adapters, their adapter mapping is swapped for that step -- in the
language model (``InputBatch.make_lora_inputs``), in the vision tower/connector
(``GPUModelRunner._execute_mm_encoder``), or both. A request running alone is never
touched, so only a mixed batch goes wrong. Each swap is recorded as
``{"event": "swap", "scope", "req_ids", "lora_ids"}``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from engine_patches import knobs, wrapping
from engine_patches.patch import APPLIED, SKIPPED, Outcome, probe, symbols
from engine_patches.records import platform_name, record_event
from engine_patches.wrapping import Originals

PROBE = "lora"
SWAP_ENV = knobs.LORA_SWAP
SCOPES = ("lm", "tower", "all")
ORIGINALS = Originals()
PROBE_MARK = "_opsctl_lora_probe"  # on the wrappers of the probe's records
SWAP_MARK = "_opsctl_lora_swap"  # on the wrappers that may swap adapters
_SEEN_SWAPS: set[tuple[str, str, str]] = set()


def requested(env: dict[str, str] | None = None) -> bool:
    """Whether ``OPSCTL_PROBES`` names this probe."""
    return wrapping.requested(PROBE, env)


def swap_scope(value: str | None) -> str | None:
    """The knob's value -> lm | tower | all; None when unset."""
    if not value:
        return None
    value = value.strip().lower()
    return value if value in SCOPES else "all"


def pick_pair(lora_ids: Sequence[int]) -> tuple[int, int] | None:
    """The first two rows whose adapters differ, both with an adapter if possible."""
    ids = [int(x) for x in lora_ids]
    for rows in ([i for i, x in enumerate(ids) if x > 0], list(range(len(ids)))):
        for i in rows:
            for j in rows:
                if j > i and ids[j] != ids[i]:
                    return i, j
    return None


def part_of(module: str, mapping: Any) -> str:
    """language | tower | connector | other, by the model's mm prefixes (longest first)."""
    if mapping is None:
        return "language"
    prefixes = [
        (p, part)
        for part, attr in (
            ("language", "language_model"),
            ("tower", "tower_model"),
            ("connector", "connector"),
        )
        for p in (getattr(mapping, attr, None) or [])
    ]
    for p, part in sorted(prefixes, key=lambda x: -len(x[0])):
        if module.startswith(p):
            return part
    return "other"


def _by_part(names: Sequence[str], mapping: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in sorted(names):
        out.setdefault(part_of(name, mapping), []).append(name)
    return out


def describe_manager(manager: Any, vllm_config: Any) -> dict:
    """The ``manager`` event: what the LoRA model manager wrapped and how it is set up."""
    mapping = getattr(manager, "mm_mapping", None)
    wrappers = getattr(manager, "punica_wrapper_mapping", {}) or {}
    cfg = manager.lora_config
    return {
        "event": "manager",
        "supports_mm": bool(getattr(manager, "supports_mm", False)),
        "tower_connector_lora": bool(getattr(manager, "supports_tower_connector_lora", False)),
        "enable_tower_connector_lora": bool(getattr(cfg, "enable_tower_connector_lora", False)),
        "punica_wrapper": sorted({type(w).__name__ for w in wrappers.values()}),
        "wrapper_prefixes": sorted(wrappers),
        "wrapped": _by_part(list(manager.modules), mapping),
        "max_loras": getattr(cfg, "max_loras", None),
        "max_lora_rank": getattr(cfg, "max_lora_rank", None),
        "compilation_mode": str(getattr(vllm_config.compilation_config, "mode", None)),
    }


def text_only_names(manager: Any, modules: Sequence[str]) -> dict[str, str]:
    """The names a text-only adapter uses, mapped to the module each reaches.

    ``{name a text-only adapter uses: the module it reaches}``. vLLM >= 0.33 applies
    an adapter trained on the text-only ``*ForCausalLM`` (``model.layers.*``,
    ``lm_head``) to a multimodal model's language model (mounted under a prefix such as
    ``language_model.``), through ``LoRAModelManager._get_text_lora_names``; {} on a
    vLLM without it (0.32 leaves such weights unused) or a text-only model."""
    names_of = getattr(manager, "_get_text_lora_names", None)
    if names_of is None:
        return {}
    out: dict[str, str] = {}
    for module in modules:
        try:
            names = names_of(module)
        except Exception:  # a probe never breaks the engine
            continue
        for name in names or ():
            out.setdefault(name, module)
    return out


def describe_adapter(request: Any, lora_model: Any, manager: Any) -> dict:
    """The ``adapter`` event: what an adapter carries and what of it the engine applies.

    Per part (language / tower / connector / other): the modules an adapter carries
    and how many of them reach a module the engine wrapped. A text-only adapter's names
    on a multimodal model count for the language model when this vLLM maps them there
    (``text_only``: how many did)."""
    mapping = getattr(manager, "mm_mapping", None)
    carried = list(getattr(lora_model, "loras", {}) or {})
    packed_of = getattr(manager, "packed_modules", {}) or {}
    wrapped = set(manager.modules) | set(packed_of)
    packed = {m for names in packed_of.values() for m in names}
    text = text_only_names(manager, sorted(wrapped | packed))
    resolved = {n: text.get(n, n) if n not in wrapped | packed else n for n in carried}
    parts: dict[str, dict[str, int]] = {}
    for part, names in _by_part(list(resolved.values()), mapping).items():
        applied = sum(1 for n in names if n in wrapped or n in packed)
        parts[part] = {"modules": len(names), "applied": applied}
    return {
        "event": "adapter",
        "name": getattr(request, "lora_name", None),
        "lora_id": getattr(request, "lora_int_id", None),
        "path": getattr(request, "lora_path", None),
        "parts": parts,
        "text_only": sum(1 for n, r in resolved.items() if r != n),
    }


@contextlib.contextmanager
def swapped(
    mapping: Any, rows: Sequence[int], req_ids: Sequence[str], scope: str
) -> Iterator[None]:
    """Swap the adapters of the first mixed pair for the duration of the block.

    The pair is taken among ``rows`` of ``mapping`` (the input batch's per-request
    adapter ids)."""
    ids = [int(mapping[r]) for r in rows]
    pair = pick_pair(ids)
    if pair is None:
        yield
        return
    a, b = rows[pair[0]], rows[pair[1]]
    mapping[a], mapping[b] = mapping[b], mapping[a]
    try:
        key = (scope, str(req_ids[pair[0]]), str(req_ids[pair[1]]))
        if key not in _SEEN_SWAPS:
            _SEEN_SWAPS.add(key)
            record_event(
                PROBE,
                {"event": "swap", "scope": scope, "req_ids": list(key[1:]), "lora_ids": ids},
            )
        yield
    finally:
        mapping[a], mapping[b] = mapping[b], mapping[a]


def _wrap_lm(original):
    @functools.wraps(original)
    def make_lora_inputs(self, num_scheduled_tokens, num_sampled_tokens):
        n = self.num_reqs
        req_ids = list(self.req_ids)[:n]
        with swapped(self.request_lora_mapping, list(range(n)), req_ids, "lm"):
            return original(self, num_scheduled_tokens, num_sampled_tokens)

    return make_lora_inputs


def _wrap_encoder(original, observe: bool, swap: bool):
    """Record which requests' images one encoder call runs, with their adapters (probe),
    and swap two of them (knob scope tower/all)."""

    @functools.wraps(original)
    def _execute_mm_encoder(self, scheduler_output):
        batch = self.input_batch
        req_ids = [
            r for r in scheduler_output.scheduled_encoder_inputs if r in batch.req_id_to_index
        ]
        rows = [batch.req_id_to_index[r] for r in req_ids]
        if observe and rows:
            ids = [int(batch.request_lora_mapping[r]) for r in rows]
            record_event(PROBE, {"event": "encoder", "req_ids": req_ids, "lora_ids": ids})
        if not swap:
            return original(self, scheduler_output)
        with swapped(batch.request_lora_mapping, rows, req_ids, "tower"):
            return original(self, scheduler_output)

    return _execute_mm_encoder


def _wrap_manager_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            cfg = kwargs.get("vllm_config") or args[-1]
            record_event(PROBE, describe_manager(self, cfg))
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "where": "manager", "error": repr(exc)})

    return __init__


def _wrap_load(original):
    @functools.wraps(original)
    def _load_adapter(self, lora_request):
        lora_model = original(self, lora_request)
        try:
            record_event(PROBE, describe_adapter(lora_request, lora_model, self._adapter_manager))
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "where": "adapter", "error": repr(exc)})
        return lora_model

    return _load_adapter


def _install(owner: Any, attr: str, wrapper, mark: str = SWAP_MARK) -> None:
    """Wrap ``owner.attr`` (a class's method or a module's function) once."""
    ORIGINALS.wrap(owner, attr, wrapper, mark, key=f"{owner.__name__}.{attr}")


V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
V2_LORA = "vllm.v1.worker.gpu.lora_utils"


def _wrap_lm_v2(original):
    """V2: swap two requests' adapters in ``LoraState.lora_ids`` while the language
    model's mapping is made (rows: ``idx_mapping``, the requests' state indices)."""

    @functools.wraps(original)
    def make_lora_inputs(self, req_ids, idx_mapping, num_scheduled_tokens, *args, **kwargs):
        rows = [int(i) for i in idx_mapping]
        with swapped(self.lora_ids, rows, list(req_ids), "lm"):
            return original(self, req_ids, idx_mapping, num_scheduled_tokens, *args, **kwargs)

    return make_lora_inputs


def _wrap_mm_loras_v2(original, observe: bool, swap: bool):
    """V2: record whose images the next encoder pass runs, with their adapters, from
    ``set_active_mm_loras``'s arguments; swap two of them around it (tower/all)."""
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def set_active_mm_loras(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs).arguments
            index, state = bound["req_id_to_index"], bound["lora_state"]
            req_ids = [str(r) for r in bound["scheduled_encoder_inputs"] or {} if r in index]
            rows = [int(index[r]) for r in req_ids]
        except Exception as exc:  # a probe never breaks the engine
            record_event(PROBE, {"event": "error", "where": "encoder", "error": repr(exc)})
            return original(*args, **kwargs)
        if observe and rows:
            ids = [int(state.lora_ids[r]) for r in rows]
            record_event(PROBE, {"event": "encoder", "req_ids": req_ids, "lora_ids": ids})
        if not swap:
            return original(*args, **kwargs)
        with swapped(state.lora_ids, rows, req_ids, "tower"):
            return original(*args, **kwargs)

    return set_active_mm_loras


def _v2_modules() -> tuple[Any, Any, str | None]:
    """(V2 runner module, V2 lora_utils module, why not) of this vLLM."""
    import importlib

    try:
        runner, lora = importlib.import_module(V2_RUNNER), importlib.import_module(V2_LORA)
    except Exception as exc:  # V2 imports CUDA-only code; absent in old releases
        return None, None, f"{V2_RUNNER} not importable ({type(exc).__name__})"
    if getattr(runner, "set_active_mm_loras", None) is None or not hasattr(
        getattr(lora, "LoraState", None), "make_lora_inputs"
    ):
        return None, None, "V2 set_active_mm_loras / LoraState.make_lora_inputs not here"
    return runner, lora, None


def apply() -> Outcome:
    """Hook the LoRA manager (probe) and the runner's adapter mapping (probe, knob)."""
    recording, scope = requested(), swap_scope(knobs.get(SWAP_ENV))
    if not recording and scope is None:
        return Outcome(SKIPPED, f"inert: OPSCTL_PROBES has no {PROBE!r} and {SWAP_ENV} is unset")
    from vllm.lora import model_manager, worker_manager

    gpu_input_batch: Any
    gpu_model_runner: Any
    try:
        from vllm.v1.worker import gpu_input_batch, gpu_model_runner
    except ImportError:  # vLLM >= 0.34: the V1 model runner is gone (V2 runners only)
        gpu_input_batch = gpu_model_runner = None
    has_v1 = gpu_model_runner is not None and gpu_input_batch is not None
    v2_runner = v2_lora = None
    why_v2: str | None = "CPUModelRunner is the V1 runner"
    if not has_v1 or platform_name() != "cpu":
        v2_runner, v2_lora, why_v2 = _v2_modules()

    done = []
    if recording:
        manager, worker = model_manager.LoRAModelManager, worker_manager.WorkerLoRAManager
        _install(manager, "__init__", _wrap_manager_init, PROBE_MARK)
        _install(worker, "_load_adapter", _wrap_load, PROBE_MARK)
        done.append("records the LoRA manager, adapters and encoder calls in events/lora.jsonl")
    if not has_v1 and v2_runner is None:
        done.append(
            "cannot observe encoder calls on this vLLM (no V1 GPUModelRunner._execute_mm_"
            f"encoder; {why_v2}): encoder calls not recorded, no adapter swap"
        )
        if not recording:
            return Outcome(SKIPPED, done[0])
        return Outcome(APPLIED, "; ".join(done))
    tower = scope in ("tower", "all")
    if has_v1:
        if scope in ("lm", "all"):
            batch = gpu_input_batch.InputBatch
            _install(batch, "make_lora_inputs", _wrap_lm)
        if recording or tower:
            wrap = functools.partial(_wrap_encoder, observe=recording, swap=tower)
            runner = gpu_model_runner.GPUModelRunner
            _install(runner, "_execute_mm_encoder", wrap)
        done.append("V1 runner hooked")
    if v2_runner is not None and v2_lora is not None:
        if scope in ("lm", "all"):
            _install(v2_lora.LoraState, "make_lora_inputs", _wrap_lm_v2)
        if recording or tower:
            wrap = functools.partial(_wrap_mm_loras_v2, observe=recording, swap=tower)
            _install(v2_runner, "set_active_mm_loras", wrap)
        done.append("V2 runner hooked (encoder calls from set_active_mm_loras)")
    if scope is not None:
        done.append(f"TEST KNOB {SWAP_ENV}={scope}: swaps two requests' adapters when batched")
    return Outcome(APPLIED, "; ".join(done))


def undo() -> None:
    """Restore every wrapped callable (tests)."""
    ORIGINALS.restore()
    _SEEN_SWAPS.clear()


PATCH = probe(
    "lora_swap_probe",
    target="vllm.lora.model_manager.LoRAModelManager, vllm.v1.worker.gpu_input_batch."
    "InputBatch.make_lora_inputs, GPUModelRunner._execute_mm_encoder; V2: vllm.v1.worker."
    "gpu.model_runner.set_active_mm_loras, gpu.lora_utils.LoraState.make_lora_inputs",
    versions="0.32 (LoRAModelManager.punica_wrapper_mapping, get_mm_lora_token_counts)",
    reason="opsctl probe for diag lora: LoRA on multimodal towers, mixed-adapter batches "
    "(PR 55897); test knob OPSCTL_LORA_SWAP plants a mixed-batch fault",
    apply=apply,
    roles=("engine_core", "worker"),
    symbols=(
        *symbols("vllm.lora.model_manager", "LoRAModelManager.__init__"),
        *symbols("vllm.lora.worker_manager", "WorkerLoRAManager._load_adapter"),
        *symbols("vllm.v1.worker.gpu_input_batch", "InputBatch.make_lora_inputs"),
        *symbols("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._execute_mm_encoder"),
    ),
    watch=(
        *symbols(
            "vllm.lora.model_manager",
            "LoRAModelManager._get_lora_layer_weights",
            "LoRAModelManager.activate_adapter",
        ),
    ),
    # the V2 runner's (CUDA since vLLM 0.26; the only one in 0.34) where V1's are gone
    alternatives=(
        (
            "vllm.v1.worker.gpu_input_batch:InputBatch.make_lora_inputs",
            "vllm.v1.worker.gpu.lora_utils:LoraState.make_lora_inputs",
        ),
        (
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner._execute_mm_encoder",
            # defined here, called by the V2 runner by this name (the probe wraps that)
            "vllm.v1.worker.gpu.mm.lora:set_active_mm_loras",
        ),
    ),
)
