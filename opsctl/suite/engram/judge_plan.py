"""`engram plan`: Engram table bytes per rank and per node, and where vLLM puts them.

Pure logic. The model side follows vLLM 0.32 (``vllm/models/deepseek_v41/common/engram.py``
and ``vllm/config/engram.py``), read from the installed source:

- config fields (``hf_text_config``): ``engram_layer_ids``, ``engram_num_embeddings``
  (rows per layer), ``engram_n_heads``, ``engram_head_dim``, ``engram_max_ngram_size``,
  ``engram_vocab_size`` (start of the per-head prime bucket sizes).
- a layer's table has ``n_hash_cols = (max_ngram_size - 1) * n_heads`` hash heads; head
  k owns a prime-sized bucket range; primes are drawn upwards from ``engram_vocab_size``
  and never reused across layers (``EngramLayout``), so the rows a rank holds are the sum
  of its heads' primes.
- each row is ``head_dim`` fp8 bytes plus ``head_dim / B`` ue8m0 scale bytes. B (the
  scale block) is 32 by default: vLLM 0.32's ``ParallelEngramEmbedding`` is built with
  ``block_size=32`` and its caller never overrides it (``can_share_engram_tables`` also
  checks with 32). ``engram_scale_block_size`` in the config (an opsctl key) or
  ``--block-size`` override it, e.g. 128 for 128-element blocks.
- heads are split over shards with ``ceil(n_hash_cols / shards)`` heads per shard; a
  sharding that leaves a rank without heads is rejected (as vLLM asserts).

Placements for TP=t, DP=d on ``nodes`` nodes (engram DP group e = replicas per node when
they divide evenly, ``_engram_dp_shard_size``):

- ``shared``: one /dev/shm file per (layer, TP shard), mapped by the e replicas of that
  TP rank: heads over t shards; per node one full copy; each rank maps 1/t of it.
  Chosen when cpu_offload, e > 1 and /dev/shm free space holds the *full* tables
  (``can_share_engram_tables`` checks ``sum(num_embeddings) * (dim + dim/B)``).
- ``dp-sharded``: the fallback; heads over t*e shards in private pinned memory; per node
  one full copy, each rank 1/(t*e).
- ``private``: TP shards only (e == 1): every replica on the node holds a full copy.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from opsctl.suite.engram.judge import DEFAULT_BLOCK


class PlanError(ValueError):
    """The config or the parallel layout cannot give a plan (bad input)."""


@dataclass(frozen=True, slots=True)
class EngramSpec:
    """A model's Engram configuration: layers, table rows, hash heads, n-gram size, block."""

    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    n_heads: int
    head_dim: int
    max_ngram_size: int
    vocab_size: int | None
    block: int
    architecture: str = ""
    block_source: str = "default"  # default (vLLM 0.32) | config | --block-size

    @property
    def n_hash_cols(self) -> int:
        """Hash heads per layer: one per head for each n-gram size above 1."""
        return (self.max_ngram_size - 1) * self.n_heads

    @property
    def row_bytes(self) -> int:
        """Bytes of one table row: fp8 weights plus one ue8m0 scale per block."""
        return self.head_dim + self.head_dim // self.block

    @property
    def total_rows(self) -> int:
        """Rows over all layers' tables."""
        return sum(self.num_embeddings)

    @property
    def total_bytes(self) -> int:
        """Bytes of all layers' tables."""
        return self.total_rows * self.row_bytes


def spec_from_config(config: dict[str, Any], block: int | None = None) -> EngramSpec:
    """Read an Engram spec from a HF config dict (top level or ``text_config``)."""
    cfg = config
    if "engram_layer_ids" not in cfg and isinstance(config.get("text_config"), dict):
        cfg = config["text_config"]
    missing = [
        k
        for k in (
            "engram_layer_ids",
            "engram_num_embeddings",
            "engram_n_heads",
            "engram_head_dim",
            "engram_max_ngram_size",
        )
        if k not in cfg
    ]
    if missing:
        raise PlanError(f"config has no Engram fields: missing {', '.join(missing)}")
    layer_ids = tuple(int(x) for x in cfg["engram_layer_ids"])
    rows = cfg["engram_num_embeddings"]
    if isinstance(rows, int):
        rows = [rows] * len(layer_ids)
    rows = tuple(int(x) for x in rows)
    if not layer_ids:
        raise PlanError("engram_layer_ids is empty: the model has no Engram layers")
    if len(rows) != len(layer_ids):
        raise PlanError(
            f"engram_num_embeddings has {len(rows)} entries for {len(layer_ids)} layers"
        )
    if block is not None:
        blk, blk_source = block, "--block-size"
    elif cfg.get("engram_scale_block_size") is not None:
        blk, blk_source = cfg["engram_scale_block_size"], "config engram_scale_block_size"
    else:
        blk, blk_source = DEFAULT_BLOCK, "default: vLLM 0.32 builds 32-element blocks"
    if isinstance(blk, bool) or not isinstance(blk, int) or blk < 1:
        raise PlanError(f"scale block size ({blk_source}) must be a positive integer, not {blk!r}")
    spec = EngramSpec(
        layer_ids=layer_ids,
        num_embeddings=rows,
        n_heads=int(cfg["engram_n_heads"]),
        head_dim=int(cfg["engram_head_dim"]),
        max_ngram_size=int(cfg["engram_max_ngram_size"]),
        vocab_size=int(cfg["engram_vocab_size"]) if cfg.get("engram_vocab_size") else None,
        block=blk,
        architecture=" ".join(config.get("architectures") or []),
        block_source=blk_source,
    )
    if spec.n_heads < 1 or spec.max_ngram_size < 2:
        raise PlanError("engram_n_heads must be >= 1 and engram_max_ngram_size >= 2")
    if spec.head_dim % blk:
        raise PlanError(
            f"engram_head_dim {spec.head_dim} is not a multiple of the scale block {blk}"
        )
    if any(r < spec.n_hash_cols for r in rows):
        raise PlanError("engram_num_embeddings is smaller than the number of hash heads")
    return spec


# ---- head bucket sizes (vLLM EngramLayout) -----------------------------------------------


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 2**32 (as vLLM's ``_is_prime``)."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in (2, 7, 61):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def head_sizes(spec: EngramSpec) -> tuple[tuple[tuple[int, ...], ...], bool]:
    """Per layer, the bucket size of every hash head, and whether they are exact.

    Heads n-gram major, as vLLM flattens them; exact: primes drawn from
    engram_vocab_size, else an even split.
    """
    if spec.vocab_size and spec.vocab_size < 2**32:
        seen: set[int] = set()
        layers: list[tuple[int, ...]] = []
        for _ in spec.layer_ids:
            sizes: list[int] = []
            for _ngram in range(spec.max_ngram_size - 1):
                current = spec.vocab_size - 1
                for _h in range(spec.n_heads):
                    current += 1
                    while not is_prime(current) or current in seen:
                        current += 1
                    seen.add(current)
                    sizes.append(current)
            layers.append(tuple(sizes))
        if all(sum(s) <= rows for s, rows in zip(layers, spec.num_embeddings, strict=True)):
            return tuple(layers), True
    even = []
    for rows in spec.num_embeddings:
        base, extra = divmod(rows, spec.n_hash_cols)
        even.append(tuple(base + (1 if i < extra else 0) for i in range(spec.n_hash_cols)))
    return tuple(even), False


def shard_rows(sizes: tuple[int, ...], shards: int) -> list[int]:
    """Rows each of ``shards`` head shards holds (vLLM: ceil(n_cols/shards) heads each)."""
    n = len(sizes)
    part = math.ceil(n / shards)
    if (shards - 1) * part >= n:
        raise PlanError(f"sharding {n} hash heads over {shards} ranks leaves ranks without heads")
    return [sum(sizes[r * part : (r + 1) * part]) for r in range(shards)]


# ---- placements ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the tables go under one placement, and the memory and files that takes."""

    name: str  # shared | dp-sharded | private
    shards: int  # head shards per table
    per_rank_bytes: int  # the largest rank
    per_node_bytes: int  # host memory the tables take on one node
    shm_bytes: int  # of that, in /dev/shm
    files_per_node: int  # /dev/shm files (shared only)
    per_rank_pss_bytes: int  # what one rank really holds (shared: split over e mappers)
    available: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """The plan for a deployment: the spec, the parallel sizes and each placement's cost."""

    spec: EngramSpec
    tp: int
    dp: int
    nodes: int
    engram_dp: int
    exact_heads: bool
    layer_bytes: tuple[int, ...]
    total_bytes: int
    placements: tuple[Placement, ...]
    shm_total_bytes: int | None  # None: unknown
    shm_free_bytes: int | None
    shm_source: str
    chosen: str
    reason: str
    fits_shm: bool | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The plan as the ``engram.plan`` document holds it (the spec's derived sizes included)."""
        d = asdict(self)
        d["spec"] = {
            **asdict(self.spec),
            "n_hash_cols": self.spec.n_hash_cols,
            "row_bytes": self.spec.row_bytes,
            "total_rows": self.spec.total_rows,
        }
        return d


def engram_dp_size(dp: int, nodes: int) -> int:
    """Node-local Engram DP group size (replicas of one node), 1 when they do not divide."""
    if dp % nodes:
        return 1
    per_node = dp // nodes
    return math.gcd(dp, per_node)


def make_plan(
    spec: EngramSpec,
    *,
    tp: int = 1,
    dp: int = 1,
    nodes: int = 1,
    shm_free: int | None = None,
    shm_total: int | None = None,
    shm_source: str = "/dev/shm",
    cpu_offload: bool = True,
) -> Plan:
    """The plan for ``spec`` under tp/dp/nodes and the /dev/shm space given; PlanError if bad."""
    if tp < 1 or dp < 1 or nodes < 1:
        raise PlanError("--tp, --dp and --nodes must be >= 1")
    if (tp * dp) % nodes:
        raise PlanError(f"{tp * dp} ranks do not divide over {nodes} nodes")
    sizes, exact = head_sizes(spec)
    e = engram_dp_size(dp, nodes)
    layer_bytes = tuple(sum(s) * spec.row_bytes for s in sizes)
    total = sum(layer_bytes)
    placements = _placements(spec, sizes, tp, max(1, dp // nodes), e, total, cpu_offload)
    fits = None if shm_free is None else total <= shm_free
    chosen, reason = _choose(cpu_offload, dp, e, fits, shm_free, shm_source, total)
    notes = []
    if not exact:
        notes.append(
            "head bucket sizes are an even split (no engram_vocab_size, or its primes "
            "exceed engram_num_embeddings); per-rank figures are approximate"
        )
    return Plan(
        spec,
        tp,
        dp,
        nodes,
        e,
        exact,
        layer_bytes,
        total,
        placements,
        shm_total,
        shm_free,
        shm_source,
        chosen,
        reason,
        fits,
        tuple(notes),
    )


def _per_rank(sizes: tuple[tuple[int, ...], ...], shards: int, row_bytes: int) -> int:
    """Bytes of the largest of ``shards`` head shards over every layer."""
    rows = [shard_rows(s, shards) for s in sizes]  # per layer, per shard
    return max(sum(layer[r] for layer in rows) for r in range(shards)) * row_bytes


def _placements(
    spec: EngramSpec,
    sizes: tuple[tuple[int, ...], ...],
    tp: int,
    replicas_per_node: int,
    e: int,
    total: int,
    cpu_offload: bool,
) -> tuple[Placement, ...]:
    per_rank_tp = _per_rank(sizes, tp, spec.row_bytes)
    # shared: one copy of every TP shard per node, mapped by the e replicas of a TP rank
    out = [
        Placement(
            "shared",
            tp,
            per_rank_tp,
            total,
            total,
            len(sizes) * tp,
            per_rank_tp // max(e, 1),
            available=cpu_offload and e > 1,
            note="needs cpu_offload, DP > 1 with co-located replicas, and /dev/shm >= full tables",
        )
    ]
    if e > 1:
        per_rank_dp = _per_rank(sizes, tp * e, spec.row_bytes)
        out.append(
            Placement(
                "dp-sharded",
                tp * e,
                per_rank_dp,
                total,
                0,
                0,
                per_rank_dp,
                available=True,
                note="fallback: heads over TP x node-local DP ranks, private pinned memory, per-step gathers",
            )
        )
    out.append(
        Placement(
            "private",
            tp,
            per_rank_tp,
            total * replicas_per_node,
            0,
            0,
            per_rank_tp,
            available=e == 1,
            note="TP shards only: every replica on the node holds a full copy",
        )
    )
    return tuple(out)


def _choose(
    cpu_offload: bool,
    dp: int,
    e: int,
    fits: bool | None,
    shm_free: int | None,
    shm_source: str,
    total: int,
) -> tuple[str, str]:
    """vLLM's placement decision and why."""
    if not cpu_offload:
        return "device", "cpu_offload is off: tables live in GPU memory, not in host memory"
    if e == 1:
        return "private", (
            "DP = 1: nothing to share"
            if dp == 1
            else "DP replicas are not co-located on one node (engram DP group size 1)"
        )
    if fits is False:
        return "dp-sharded", (
            f"{shm_source} holds {shm_free} bytes free, less than the {total} bytes of tables: "
            "vLLM falls back to DP head sharding (raise --shm-size / use --ipc=host)"
        )
    return "shared", f"{e} co-located DP replicas share one copy in {shm_source}" + (
        "" if fits else " (free space not known)"
    )


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64M', '200G', '188.8GiB', '1024' (bytes) -> bytes. K/M/G/T are binary (as docker)."""
    m = _SIZE.match(text)
    if not m:
        raise PlanError(f"not a size: {text!r} (e.g. 64M, 200G, 188.8GiB or a number of bytes)")
    number, unit = float(m.group(1)), m.group(2).lower()
    return int(number * 1024 ** "_kmgt".index(unit)) if unit else int(number)
