"""The fault-injecting KV connector's contract: configuration, plan and failed blocks.

The one pure module (no torch, no vLLM, no opsctl I/O) that both sides import: the
connector (:mod:`engine_patches.connectors.fault_kv`, inside vLLM's worker) and opsctl
(``opsctl.suite.kv_fail.judge`` validates arguments and plans the workload;
``opsctl.suite.kv_fail.collect`` writes the control file; ``opsctl.suite.kv_fail.run`` builds
the ``--kv-transfer-config``).

Configuration (:func:`kv_transfer_config`): ``kv_connector_extra_config`` holds
``inject`` (the initial :class:`InjectionPlan`), optionally ``storage_path`` (default
``$OPSCTL_RUN_DIR/kv_store``) and ``control_file`` (default ``<storage>/control.json``).
The control file (:func:`control_text` / :func:`plan_from_control`) replaces the plan
while the engine runs; the connector adopts it at its next load whenever the file's
content changed.

Events the connector writes (``<run>/events/<kind>.jsonl``): :data:`INJECTIONS` (one per
injected block), :data:`TRANSFERS` (one per store/load of a request), :data:`CONNECTOR`
(start-up facts per role).

A loaded block is identified by the request's *prefix key* (a hash of the
block-aligned prompt tokens the connector stores KV for), its KV cache group and
its position (block index within the request's block list of that group). A block
is injected when the request is targeted and the block is chosen:

- requests: empty = every request; otherwise prefix keys (or request-id substrings).
- blocks SPEC: comma-separated ``POS`` (every group) or ``GROUP:POS``; POS counts
  from 0, negative from the end of the loaded blocks (``-1`` = last loaded block);
  ``*`` as POS means every loaded block. Example: ``1:-1,0:0``.
- rate R: each loaded block fails with probability R, drawn from a hash of
  (seed, prefix key, group, position), so a run is reproducible whatever the order
  in which the engine schedules requests.
- requests without blocks or rate: the default blocks SPEC ``-1``.

The null block (padding for positions that slid out of a window, id 0) is never
injected: it holds no loaded data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

NULL_BLOCK_ID = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID
DEFAULT_SPEC = "-1"
# how a failed load reaches vLLM: failed blocks (get_block_ids_with_load_errors, loads in
# the computing step) or failed requests (failed_recving, asynchronous loads; vLLM 0.30+)
ROUTES = ("blocks", "requests")

CONNECTOR_NAME = "FaultInjectingConnector"
MODULE_PATH = "engine_patches.connectors.fault_kv"
STORE_DIR = "kv_store"  # under the run directory
CONTROL_FILE = "control.json"  # under the storage directory
INJECTIONS, TRANSFERS, CONNECTOR = "kv_injections", "kv_transfers", "kv_connector"


class SpecError(ValueError):
    """A malformed blocks SPEC or injection setting."""


@dataclass(frozen=True, slots=True)
class BlockSel:
    """One item of a blocks spec: a group (None: every group) and a position."""

    group: int | None  # None: every group
    position: int | None  # None: every position


def parse_blocks_spec(spec: str) -> tuple[BlockSel, ...]:
    """The selections of a blocks spec (``POS`` or ``GROUP:POS``, comma-separated)."""
    items = [s.strip() for s in spec.split(",")]
    if not spec.strip() or any(not s for s in items):
        raise SpecError(
            f"empty item in blocks spec {spec!r} (want POS or GROUP:POS, comma-separated)"
        )
    out = []
    for item in items:
        group_s, _, pos_s = item.rpartition(":")
        try:
            group = None if group_s in ("", "*") else int(group_s)
            position = None if pos_s == "*" else int(pos_s)
        except ValueError:
            raise SpecError(
                f"bad item {item!r} in blocks spec (want POS or GROUP:POS, e.g. -1 or 1:0)"
            ) from None
        if group is not None and group < 0:
            raise SpecError(f"negative group in blocks spec item {item!r}")
        out.append(BlockSel(group, position))
    return tuple(out)


@dataclass(frozen=True)
class InjectionPlan:
    """Which loaded KV blocks the connector fails: by spec, by rate, for which prompts."""

    rate: float = 0.0
    seed: int = 0
    blocks: str | None = None
    requests: tuple[str, ...] = ()
    corrupt: bool = True  # overwrite the reported blocks' bytes
    silent: bool = False  # corrupt but do NOT report (sensitivity check)
    epoch: str = ""  # label echoed in every injection event
    enabled: bool = True
    _sels: tuple[BlockSel, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.rate) <= 1.0:
            raise SpecError(f"rate {self.rate} is outside 0..1")
        spec = self.blocks
        if spec is None and self.requests and not self.rate:
            spec = DEFAULT_SPEC
        object.__setattr__(self, "_sels", parse_blocks_spec(spec) if spec else ())

    @property
    def active(self) -> bool:
        """Whether the plan fails anything at all (enabled, with blocks or a rate)."""
        return self.enabled and (bool(self._sels) or self.rate > 0)

    def targets(self, key: str, request_id: str = "") -> bool:
        """Whether the plan applies to the prefix ``key`` of request ``request_id``."""
        if not self.requests:
            return True
        return any(r == key or (r and r in request_id) for r in self.requests)

    def chooses(self, key: str, group: int, position: int, n_positions: int) -> bool:
        """Whether the block at ``position`` of ``group`` is to fail (selected or drawn)."""
        for sel in self._sels:
            if sel.group is not None and sel.group != group:
                continue
            if sel.position is None:
                return True
            want = sel.position if sel.position >= 0 else n_positions + sel.position
            if want == position:
                return True
        return self.rate > 0 and unit_draw(self.seed, key, group, position) < self.rate

    def select(
        self,
        key: str,
        request_id: str,
        block_ids_by_group: Sequence[Sequence[int]],
        ranges: Sequence[tuple[int, int]],
    ) -> list[tuple[int, int, int]]:
        """The loaded blocks the plan fails for one transfer.

        (group, position, block id) of the loaded blocks to fail; ``ranges[g]`` is
        the (start, end) of the loaded positions of group g's block list."""
        if not self.active or not self.targets(key, request_id):
            return []
        chosen = []
        for group, ids in enumerate(block_ids_by_group):
            start, end = ranges[group] if group < len(ranges) else (0, 0)
            stop = min(end, len(ids))
            for pos in range(start, stop):
                block = ids[pos]
                if block == NULL_BLOCK_ID:
                    continue
                if self.chooses(key, group, pos, stop):
                    chosen.append((group, pos, block))
        return chosen

    def to_json(self) -> dict:
        """The plan as JSON data (the connector's extra config or the control file)."""
        d = asdict(self)
        d.pop("_sels", None)
        d["requests"] = list(self.requests)
        return d

    @classmethod
    def from_json(cls, data: dict | None) -> InjectionPlan:
        """The plan in JSON data; the defaults for what it does not say."""
        data = dict(data or {})
        data.pop("_sels", None)
        known = {
            k: data[k]
            for k in ("rate", "seed", "blocks", "corrupt", "silent", "epoch", "enabled")
            if k in data
        }
        return cls(requests=tuple(data.get("requests") or ()), **known)


def unit_draw(seed: int, key: str, group: int, position: int) -> float:
    """A reproducible draw in [0, 1) for one block of one prefix under ``seed``."""
    digest = hashlib.sha256(f"{seed}|{key}|{group}|{position}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def prefix_len(num_prompt_tokens: int, block_size: int) -> int:
    """How many prompt tokens the connector stores and loads for a prompt.

    Whole blocks, leaving at least the last prompt token to compute (so the engine
    samples a next token)."""
    if num_prompt_tokens <= 1:
        return 0
    return (num_prompt_tokens - 1) // block_size * block_size


def prefix_key(token_ids: Iterable[int]) -> str:
    """The stored prefix's key: a short hash of its token ids."""
    data = ",".join(str(int(t)) for t in token_ids).encode()
    return hashlib.sha256(data).hexdigest()[:24]


def control_text(plan: InjectionPlan) -> str:
    """The control file's content that makes the running connector adopt ``plan``."""
    return json.dumps({"inject": plan.to_json()}, sort_keys=True)


def plan_from_control(text: str) -> InjectionPlan:
    """The plan in a control file's content (ValueError, SpecError: not a valid one)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise SpecError("the control file holds no JSON object")
    return InjectionPlan.from_json(data.get("inject"))


def kv_transfer_config(
    storage_path: str | None = None,
    *,
    policy: str = "recompute",
    inject: InjectionPlan | None = None,
    role: str = "kv_both",
    route: str = ROUTES[0],
) -> str:
    """The ``--kv-transfer-config`` JSON that loads the fault-injecting connector.

    ``inject`` is its first plan (default: nothing injected), ``route`` its failure
    route."""
    plan = inject if inject is not None else InjectionPlan(enabled=False)
    extra: dict = {"inject": plan.to_json()}
    if route != ROUTES[0]:
        extra["route"] = route
    if storage_path:
        extra["storage_path"] = storage_path
    return json.dumps(
        {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": MODULE_PATH,
            "kv_role": role,
            "kv_load_failure_policy": policy,
            "kv_connector_extra_config": extra,
        }
    )
