"""A KV connector that stores, reloads and deliberately fails KV blocks (opsctl kv-fail).

``FaultInjectingConnector``: a KV connector that stores and reloads KV for every
KV cache group and reports chosen loaded blocks as failed.

Load it with ``--kv-transfer-config`` (see
:func:`engine_patches.connectors.injection.kv_transfer_config`):
``{"kv_connector": "FaultInjectingConnector",
   "kv_connector_module_path": "engine_patches.connectors.fault_kv",
   "kv_role": "kv_both", "kv_load_failure_policy": "recompute" | "fail",
   "kv_connector_extra_config": {"storage_path": DIR, "inject": {...InjectionPlan...}}}``

Storage: ``DIR/<prefix key>/rank<r>/g<group>_p<position>.safetensors`` holds one block
of every layer of that group as rank ``r`` holds it; ``rank<r>/meta.json`` is written
last and marks that rank's part complete. The prefix key hashes the block-aligned
prompt prefix (all prompt tokens but the last, rounded down to whole blocks).

Ranks: with tensor (or pipeline) parallelism every worker holds its share of the KV
(its KV heads, its layers), so each rank stores and loads its own part, and the
scheduler offers a prefix only once every rank of the engine stored it. The injection
plan is deterministic (seed, prefix, group, position), so every rank fails the same
blocks and reports the same block ids (vLLM unions the workers' reports); every event
carries the worker's ``rank``, so opsctl can count one rank's and compare the others'.

Flow (synchronous, like vLLM's ExampleConnector):
- scheduler side: a new request whose prefix is stored gets an external hit of the
  whole prefix; a new request whose prefix is not stored and whose prefix is
  computed in this step is stored.
- worker side: ``start_load_kv`` (before the forward) copies the stored blocks into
  the request's blocks of every group (skipping the null block, i.e. positions that
  slid out of a sliding window) and applies the injection plan: a chosen block is
  reported through ``get_block_ids_with_load_errors`` (and, with ``corrupt``, its
  bytes are overwritten, so a failure that recovery misses shows in the outputs).
  ``wait_for_save`` (after the forward) copies the computed blocks out.

The injection plan comes from ``inject`` in the extra config and can be replaced
while the engine runs by writing ``DIR/control.json`` (``{"inject": {...}}``,
:func:`engine_patches.connectors.injection.control_text`), so one engine serves a
failure-free round trip and an injected run. The file is compared by content at every
load, never by mtime (two writes within one mtime tick both count).

Events (``<run>/events/<kind>.jsonl``): ``kv_injections`` (request id, prefix key,
group, block, position, epoch), ``kv_transfers`` (store/load per request),
``kv_connector`` (start-up facts per role).

Two failure routes (``route`` in the extra config), the two vLLM has:

- ``blocks`` (default): loads are synchronous (in the step that computes the rest of the
  prompt) and a chosen block is reported through ``get_block_ids_with_load_errors``;
  vLLM truncates the request to its first failed block. vLLM 0.31-0.34 refuse this route
  for a model with several KV cache groups (RuntimeError; 0.26-0.29 ValueError), which
  opsctl's kv_hybrid_recompute patch makes recover.
- ``requests``: loads are asynchronous (``load_kv_async``: the request waits in
  WAITING_FOR_REMOTE_KVS while the worker loads) and a request with a chosen block is
  reported as a failed receive (``KVConnectorTransferResults.failed_recving``, with
  ``finished_recving``; vLLM 0.30+ only). Under ``recompute`` vLLM recomputes it from
  token 0: the scheduler side learns of the failure (``update_connector_output``) and
  never offers that request an external hit again, as a connector that knows its remote
  failed would; under ``fail`` it finishes with an error. This is upstream's supported
  route for several groups.

Implements ``SupportsHMA`` so vLLM keeps the hybrid KV cache manager (several groups).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from engine_patches.connectors.injection import (
    CONNECTOR,
    CONTROL_FILE,
    INJECTIONS,
    NULL_BLOCK_ID,
    ROUTES,
    STORE_DIR,
    TRANSFERS,
    InjectionPlan,
    plan_from_control,
    prefix_key,
    prefix_len,
)
from engine_patches.registry import record_event

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class Transfer:
    """One request's KV load or store: its prefix key, blocks and token range."""

    req_id: str
    key: str
    block_ids: tuple[list[int], ...]
    first_token: int  # first token whose KV moves
    n_tokens: int  # one past the last token whose KV moves

    def ranges(self, block_sizes: list[int]) -> list[tuple[int, int]]:
        """(start, end) block positions per group."""
        return [(self.first_token // size, self.n_tokens // size) for size in block_sizes]


@dataclass
class FaultKVMetadata(KVConnectorMetadata):
    """What the scheduler side hands the worker side for one step: loads and stores."""

    loads: list[Transfer] = field(default_factory=list)
    stores: list[Transfer] = field(default_factory=list)
    async_ids: set[str] = field(default_factory=set)  # loads of route requests


def worker_rank(tp_size: int) -> int:
    """This worker's rank in its engine: PP rank x TP size + TP rank.

    0 without torch.distributed (the model in the EngineCore, one rank)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return int(get_pp_group().rank_in_group) * int(tp_size) + int(get_tp_group().rank_in_group)
    except Exception:  # not initialised: a single rank
        return 0


def default_storage_path() -> str:
    """Where stored KV goes: under the run directory, else a fixed folder in /tmp."""
    run = os.environ.get("OPSCTL_RUN_DIR")
    return str(Path(run) / STORE_DIR) if run else "/tmp/opsctl-kv-store"


class FaultInjectingConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM V1 KV connector that round-trips every group's blocks and fails chosen ones."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.storage = Path(extra.get("storage_path") or default_storage_path())
        self.storage.mkdir(parents=True, exist_ok=True)
        self.control_file = Path(extra.get("control_file") or self.storage / CONTROL_FILE)
        self.plan = InjectionPlan.from_json(extra.get("inject"))
        self.route = str(extra.get("route") or ROUTES[0])
        if self.route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, not {self.route!r}")
        self._control_text: str | None = None
        self.block_size = int(vllm_config.cache_config.block_size)
        groups = kv_cache_config.kv_cache_groups
        self.group_block_sizes = [
            int(getattr(g.kv_cache_spec, "block_size", self.block_size)) for g in groups
        ]
        self.group_layers = [list(g.layer_names) for g in groups]
        self.num_blocks = int(kv_cache_config.num_blocks)
        # ranks: the engine's workers (TP x PP) each store their part; this worker's rank
        parallel = vllm_config.parallel_config
        self.world = max(
            1, int(parallel.tensor_parallel_size) * int(parallel.pipeline_parallel_size)
        )
        self.rank = (
            worker_rank(parallel.tensor_parallel_size) if role == KVConnectorRole.WORKER else 0
        )
        # scheduler side
        self._need_load: dict[str, tuple[Request, int]] = {}
        self._async_loads: dict[str, Transfer] = {}  # route requests: allocated, not sent
        self._failed_requests: set[str] = set()  # route requests: never offered again
        self._storing: set[str] = set()
        # worker side
        self._kv: dict[str, torch.Tensor] = {}
        self._invalid: set[int] = set()
        self._recv_done: set[str] = set()  # route requests: loaded (or failed) this step
        self._recv_failed: set[str] = set()
        self._lock = threading.Lock()
        with contextlib.suppress(Exception):
            record_event(
                CONNECTOR,
                {
                    "role": role.name.lower(),
                    "rank": self.rank,
                    "world": self.world,
                    "storage": str(self.storage),
                    "groups": len(groups),
                    "group_block_sizes": self.group_block_sizes,
                    "policy": self._kv_transfer_config.kv_load_failure_policy,
                    "route": self.route,
                    "inject": self.plan.to_json(),
                },
            )

    # ---- helpers --------------------------------------------------------------
    def _prefix(self, token_ids: list[int]) -> tuple[int, str]:
        size = max(self.group_block_sizes or [self.block_size])
        n = prefix_len(len(token_ids), size)
        return n, prefix_key(token_ids[:n]) if n else ""

    def _part(self, key: str, rank: int | None = None) -> Path:
        """Where rank ``rank`` (default: this worker's) keeps its part of prefix ``key``."""
        return self.storage / key / f"rank{self.rank if rank is None else rank}"

    def _stored(self, key: str) -> bool:
        """Whether every rank of the engine stored its part of prefix ``key``."""
        return bool(key) and all(
            (self._part(key, r) / "meta.json").is_file() for r in range(self.world)
        )

    def _positions(self, n_tokens: int, group: int) -> int:
        size = (
            self.group_block_sizes[group]
            if group < len(self.group_block_sizes)
            else self.block_size
        )
        return n_tokens // size

    # ---- scheduler side ---------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Offer the stored prefix of a prompt (async on the requests route), or nothing."""
        n, key = self._prefix(list(request.prompt_token_ids or []))
        if n <= num_computed_tokens or not self._stored(key):
            return 0, False
        if self.route == "requests":
            if request.request_id in self._failed_requests:
                with contextlib.suppress(Exception):
                    record_event(
                        CONNECTOR,
                        {"role": "scheduler", "request_id": request.request_id, "offered": 0},
                    )
                return 0, False  # its load failed: recomputed, never loaded again
            return n - num_computed_tokens, True
        return n - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ):
        """Plan the load of an offered prefix into the blocks just allocated for it."""
        if num_external_tokens <= 0:
            return
        if self.route == "requests":  # not scheduled this step: load into these blocks
            n, key = self._prefix(list(request.prompt_token_ids or []))
            self._async_loads[request.request_id] = self._transfer(
                request.request_id, key, blocks.get_block_ids(), n - num_external_tokens, n
            )
            return
        self._need_load[request.request_id] = (request, num_external_tokens)

    def update_connector_output(self, connector_output) -> None:
        """Remember the requests whose asynchronous load failed (never offered again)."""
        failed = getattr(connector_output, "failed_recving", None)
        if failed:
            self._failed_requests |= set(failed)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """Every KV cache group: the connector loads all of them."""
        return tuple(range(len(self.group_layers)))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's metadata: the loads planned so far and the new prefixes to store."""
        meta = FaultKVMetadata()
        meta.loads.extend(self._async_loads.values())
        meta.async_ids.update(self._async_loads)
        self._async_loads.clear()
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            n, key = self._prefix(tokens)
            if not n:
                continue
            if new.req_id in self._need_load:
                _req, n_ext = self._need_load.pop(new.req_id)
                first = new.num_computed_tokens - n_ext
                meta.loads.append(self._transfer(new.req_id, key, new.block_ids, first, n))
                continue
            scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            done = new.num_computed_tokens + scheduled >= n
            if done and key not in self._storing and not self._stored(key):
                self._storing.add(key)
                meta.stores.append(self._transfer(new.req_id, key, new.block_ids, 0, n))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in self._need_load or req_id not in cached.resumed_req_ids:
                continue
            request, n_ext = self._need_load.pop(req_id)
            n, key = self._prefix(list(request.prompt_token_ids or []))
            block_ids = cached.new_block_ids[i]
            if block_ids is None:
                continue
            first = cached.num_computed_tokens[i] - n_ext
            meta.loads.append(self._transfer(req_id, key, block_ids, first, n))
        self._need_load.clear()
        # keys whose store was issued are visible on disk from the next step on
        self._storing = {k for k in self._storing if not self._stored(k)}
        return meta

    def _transfer(
        self, req_id: str, key: str, block_ids, first_token: int, n_tokens: int
    ) -> Transfer:
        return Transfer(
            req_id, key, tuple(list(b) for b in block_ids), max(0, first_token), n_tokens
        )

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forget a finished request; its blocks are never held for a transfer."""
        self._forget(request.request_id)
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forget a finished request (hybrid allocator); its blocks are never held."""
        self._forget(request.request_id)
        return False, None

    def _forget(self, req_id: str) -> None:
        self._need_load.pop(req_id, None)
        self._async_loads.pop(req_id, None)
        self._failed_requests.discard(req_id)

    # ---- worker side -------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        """Learn the worker's KV cache tensors per group and adopt the current plan."""
        self._kv = dict(kv_caches)
        with contextlib.suppress(Exception):
            shapes = {name: list(t.shape) for name, t in list(self._kv.items())[:2]}
            record_event(
                CONNECTOR,
                {
                    "role": "worker_kv",
                    "layers": len(self._kv),
                    "shapes": shapes,
                    "num_blocks": self.num_blocks,
                },
            )

    def _layer_tensor(
        self, name: str, forward_context: ForwardContext | None
    ) -> torch.Tensor | None:
        kv = self._kv.get(name)
        if kv is None and forward_context is not None:
            layer = forward_context.no_compile_layers.get(name)
            kv = getattr(layer, "kv_cache", None)
            if isinstance(kv, list):  # older releases: one tensor per virtual engine
                kv = kv[0] if kv else None
        return kv if isinstance(kv, torch.Tensor) else None

    def _block_view(self, kv: torch.Tensor, block_id: int) -> torch.Tensor:
        """The memory of one scheduler block of a layer (kernel blocks may be smaller)."""
        per = max(1, kv.shape[0] // self.num_blocks) if self.num_blocks else 1
        return kv[block_id * per : (block_id + 1) * per]

    def _refresh_plan(self) -> None:
        """Adopt the control file's plan when its content changed (a bad one is
        recorded once and the current plan kept)."""
        try:
            text = self.control_file.read_text()
        except OSError:
            return
        if text == self._control_text:
            return
        self._control_text = text
        try:
            self.plan = plan_from_control(text)
        except ValueError as exc:  # SpecError is one
            record_event(CONNECTOR, {"role": "worker", "control_error": repr(exc)})

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Load this step's planned blocks, failing (and corrupting) the plan's choice."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, FaultKVMetadata)
        if not meta.loads:
            return
        self._refresh_plan()
        for t in meta.loads:
            failed = self._load_one(t, forward_context, t.req_id in meta.async_ids)
            if t.req_id in meta.async_ids:
                with self._lock:
                    self._recv_done.add(t.req_id)
                    if failed:
                        self._recv_failed.add(t.req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """The asynchronous loads finished since the last call (nothing is ever sent)."""
        with self._lock:
            done, self._recv_done = self._recv_done, set()
        return None, done or None

    def get_transfer_results(self, finished_req_ids: set[str]):
        """The asynchronous loads of the step, finished and failed.

        Route requests only; a failed one is in both sets (vLLM's contract: a failed
        receive is also a finished one)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        with self._lock:
            done, self._recv_done = self._recv_done, set()
            failed, self._recv_failed = self._recv_failed, set()
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed & done)

    @staticmethod
    def _real_blocks(t: Transfer, ranges) -> Iterator[tuple[int, int, int]]:
        """(group, position, block id) of every transferred block but the null block."""
        for group, ids in enumerate(t.block_ids):
            start, end = ranges[group]
            for pos in range(start, min(end, len(ids))):
                if ids[pos] != NULL_BLOCK_ID:
                    yield group, pos, ids[pos]

    def _load_one(
        self, t: Transfer, forward_context: ForwardContext | None, whole_request: bool = False
    ) -> bool:
        """Load one transfer; True when an injected failure was reported for it. With
        ``whole_request`` (route requests) the failure is the request's, not its blocks'."""
        folder = self._part(t.key)
        missing: list[tuple[int, int, int]] = []
        loaded = 0
        ranges = t.ranges(self.group_block_sizes)
        for group, pos, block in self._real_blocks(t, ranges):
            path = folder / f"g{group}_p{pos}.safetensors"
            try:
                stored = safetensors.torch.load_file(str(path))
            except (OSError, ValueError):
                missing.append((group, pos, block))
                continue
            for name in self.group_layers[group]:
                kv = self._layer_tensor(name, forward_context)
                if kv is None or name not in stored:
                    continue
                self._block_view(kv, block).copy_(stored[name].to(kv.device, kv.dtype))
            loaded += 1
        chosen = self.plan.select(t.key, t.req_id, t.block_ids, ranges)
        reported = bool(chosen or missing) and not (self.plan.silent and not missing)
        if not whole_request:
            with self._lock:
                self._invalid.update(b for _g, _p, b in missing)
                if not self.plan.silent:
                    self._invalid.update(b for _g, _p, b in chosen)
        for group, pos, block in chosen:
            if self.plan.corrupt or self.plan.silent:
                self._corrupt(group, block, forward_context)
            record_event(
                INJECTIONS,
                {
                    "request_id": t.req_id,
                    "key": t.key,
                    "group": group,
                    "block": block,
                    "position": pos,
                    "rank": self.rank,
                    "epoch": self.plan.epoch,
                    "reported": not self.plan.silent,
                    "corrupted": self.plan.corrupt or self.plan.silent,
                },
            )
        record_event(
            TRANSFERS,
            {
                "op": "load",
                "request_id": t.req_id,
                "key": t.key,
                "rank": self.rank,
                "blocks": loaded,
                "missing": len(missing),
                "injected": len(chosen),
                "epoch": self.plan.epoch,
                "route": self.route,
            },
        )
        return reported

    def _corrupt(self, group: int, block: int, forward_context: ForwardContext | None) -> None:
        gen = torch.Generator().manual_seed(int(self.plan.seed) * 1_000_003 + block)
        for name in self.group_layers[group]:
            kv = self._layer_tensor(name, forward_context)
            if kv is None:
                continue
            view = self._block_view(kv, block)
            noise = torch.randn(view.shape, generator=gen, dtype=torch.float32) * 4.0
            view.copy_(noise.to(view.device, view.dtype))

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: every load completes in start_load_kv."""
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Nothing per layer: stores happen once per step in wait_for_save."""
        return  # stores happen once per step in wait_for_save, every layer at once

    def wait_for_save(self):
        """Store the step's new prefixes, every layer of every group at once."""
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, FaultKVMetadata):
            return
        for t in meta.stores:
            self._store_one(t)

    def _store_one(self, t: Transfer) -> None:
        folder = self._part(t.key)
        if (folder / "meta.json").is_file():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.storage / f".{t.key}.rank{self.rank}.{os.getpid()}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        stored = 0
        for group, pos, block in self._real_blocks(t, t.ranges(self.group_block_sizes)):
            tensors = {}
            for name in self.group_layers[group]:
                kv = self._layer_tensor(name, None)
                if kv is not None:
                    tensors[name] = (
                        self._block_view(kv, block).detach().to("cpu").clone().contiguous()
                    )
            safetensors.torch.save_file(tensors, str(tmp / f"g{group}_p{pos}.safetensors"))
            stored += 1
        (tmp / "meta.json").write_text(
            json.dumps(
                {
                    "key": t.key,
                    "tokens": t.n_tokens,
                    "groups": len(t.block_ids),
                    "block_sizes": self.group_block_sizes,
                }
            )
        )
        try:
            os.replace(tmp, folder)
        except OSError:  # another writer won the race; its copy is as good
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        record_event(
            TRANSFERS,
            {
                "op": "store",
                "request_id": t.req_id,
                "key": t.key,
                "rank": self.rank,
                "blocks": stored,
                "epoch": self.plan.epoch,
            },
        )

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The blocks reported as failed since the last call (then forgotten)."""
        with self._lock:
            out, self._invalid = self._invalid, set()
        return out
