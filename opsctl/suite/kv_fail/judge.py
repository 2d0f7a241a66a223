"""`diag kv-fail` logic, pure: settings, workload, output comparison and recovery accounting.

Also what the connector can serve, and accounting from the engine's own log lines and from the
connector's and the patch's events. Pure (no I/O): the check (opsctl.suite.kv_fail.run)
collects, this module and :mod:`opsctl.suite.kv_fail.judge_report` (findings, verdict, the
report) decide.

The diag runs one engine with the fault-injecting connector through phases:
``store`` (failure-free baseline; the connector stores every prompt's KV),
``roundtrip`` (the same prompts reload their KV, nothing injected: outputs must equal
the baseline), ``inject`` (reload with failures injected: the engine must survive and
every request that did not fail must equal its baseline) and ``sensitivity`` (the
same blocks corrupted *without* being reported: outputs should now differ, which
shows the comparison would catch a failure that recovery missed).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_patches.connectors.injection import (
    ROUTES,
    InjectionPlan,
    SpecError,
    prefix_key,
    prefix_len,
)
from opsctl.domain.metrics import MetricsSnapshot
from opsctl.domain.records import record

POLICIES = ("recompute", "fail")
ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "attention", "global", "local"}
BLOCK_SIZE = 32  # the diag runs the engine with --block-size 32 (CPU kernels want multiples of 32)
PATCH_NAME = "kv_hybrid_recompute"  # the engine patch this diag proves (multi-group recovery)
# every engine patch that makes a failed KV load recover (docs/gpu.md): --no-patch turns
# all of them off, the report lists each one's status
REWIND_PATCH = "kv_rewind_v2"  # the V2 model runner applies the scheduler's rewind
INFLIGHT_PATCH = "kv_async_inflight"  # async scheduling drops the step in flight
RECOVERY_PATCHES = (PATCH_NAME, INFLIGHT_PATCH, REWIND_PATCH)
METRICS = (  # /metrics counters whose change over the inject phase the report shows
    "vllm:external_prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
)

_RECOVERED = re.compile(
    r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)"
)
_FAILING = re.compile(
    r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=fail, (\d+) tokens affected\)"
)
_DEATH = (
    "EngineDeadError",
    "EngineCore encountered a fatal error",
    "not supported for models with multiple KV cache groups",
    "too many values to unpack",
)


# ---- arguments --------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """The run's arguments: failure policy, injection rate or blocks, request count and seed."""

    policy: str = "recompute"
    rate: float | None = None
    blocks: str | None = None
    requests: int = 4
    seed: int = 0
    targets: int | None = None  # how many requests get injections (None: half, rounded up)
    max_tokens: int = 16
    # how the connector reports a failure: failed blocks (synchronous loads) or failed
    # requests (asynchronous loads, failed_recving: vLLM 0.30+)
    route: str = ROUTES[0]

    def validate(self) -> None:
        """Raise ValueError with one line for bad arguments."""
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.route not in ROUTES:
            raise ValueError(f"unknown route {self.route!r}; choose one of {', '.join(ROUTES)}")
        if self.rate is not None and self.blocks is not None:
            raise ValueError("give either --rate or --blocks, not both")
        if self.rate is not None and not (0.0 <= self.rate <= 1.0 and math.isfinite(self.rate)):
            raise ValueError(f"--rate {self.rate} is outside 0..1")
        if not 1 <= self.requests <= 64:
            raise ValueError(f"--requests {self.requests} is outside 1..64")
        if self.targets is not None and not 0 <= self.targets <= self.requests:
            raise ValueError(f"--fail-requests {self.targets} is outside 0..{self.requests}")
        if not 1 <= self.max_tokens <= 128:
            raise ValueError(f"--max-tokens {self.max_tokens} is outside 1..128")
        try:
            self.plan(())
        except SpecError as exc:
            raise ValueError(str(exc)) from None

    @property
    def mode(self) -> str:
        """How failures are injected: ``"rate"`` or ``"blocks"``."""
        return "rate" if self.rate is not None else "blocks"

    def plan(
        self, target_keys: tuple[str, ...], epoch: str = "inject", *, silent: bool = False
    ) -> InjectionPlan:
        """The connector's injection plan for the targeted prefix keys in one phase (``epoch``)."""
        if self.rate is not None:
            return InjectionPlan(
                rate=self.rate, seed=self.seed, requests=target_keys, epoch=epoch, silent=silent
            )
        return InjectionPlan(
            blocks=self.blocks or "-1",
            seed=self.seed,
            requests=target_keys,
            epoch=epoch,
            silent=silent,
        )


def servable(config: dict) -> str | None:
    """Why the connector cannot serve a model (None: it can).

    The connector moves attention KV blocks of decoder models; recurrent state (Mamba, linear
    attention), encoders and multimodal towers are out of its reach.
    """
    archs = " ".join(config.get("architectures") or [])
    if not archs:
        return "config.json names no architecture"
    if "CausalLM" not in archs:
        return (
            f"architecture {archs} is not a decoder (the connector moves decoder attention KV only)"
        )
    text = str(config.get("model_type", "")) + " " + archs
    if any(
        w in text.lower()
        for w in ("mamba", "jamba", "bamba", "granitemoehybrid", "nemotron_h", "qwen3_next")
    ):
        return f"architecture {archs} keeps recurrent (Mamba) state the connector cannot store"
    kinds = set(config.get("layer_types") or [])
    other = kinds - ATTENTION_LAYER_TYPES
    if other:
        return f"layer types {sorted(other)} are not attention layers the connector can store"
    return None


# ---- workload ---------------------------------------------------------------------
def make_prompts(
    n: int, seed: int, vocab_size: int, *, block_size: int = BLOCK_SIZE, max_len: int = 160
) -> list[list[int]]:
    """N token-id prompts of 2-4 whole blocks plus a tail, distinct, reproducible.

    Token ids avoid the first four (special tokens of the embedded tokenizer).
    """
    rng = random.Random(seed)
    lo, hi = 4, max(5, vocab_size - 1)
    prompts: list[list[int]] = []
    keys: set[str] = set()
    while len(prompts) < n:
        blocks = rng.randint(2, 4)
        length = min(max_len, blocks * block_size + rng.randint(2, block_size - 1))
        p = [rng.randint(lo, hi) for _ in range(length)]
        k = prefix_key(p[: prefix_len(len(p), block_size)])
        if k not in keys:
            keys.add(k)
            prompts.append(p)
    return prompts


def choose_targets(n: int, seed: int, k: int | None) -> list[int]:
    """Indices of the requests that get injections (sorted)."""
    k = math.ceil(n / 2) if k is None else k
    return sorted(random.Random(seed + 7919).sample(range(n), k))


def targets_of(s: Settings) -> list[int]:
    """The targeted requests: a rate without --fail-requests applies to every request."""
    if s.rate is not None and s.targets is None:
        return list(range(s.requests))
    return choose_targets(s.requests, s.seed, s.targets)


def keys_of(prompts: Sequence[Sequence[int]], block_size: int = BLOCK_SIZE) -> list[str]:
    """Each prompt's prefix key: what the connector stores its whole blocks under."""
    return [prefix_key(p[: prefix_len(len(p), block_size)]) for p in prompts]


@dataclass(frozen=True)
class Workload:
    """The prompts, which of them get injections, and their prefix keys."""

    prompts: tuple[tuple[int, ...], ...]
    targets: tuple[int, ...]  # indices of the requests that get injections
    keys: tuple[str, ...]  # each prompt's prefix key (what the connector stores it under)

    @property
    def target_keys(self) -> tuple[str, ...]:
        """The prefix keys of the targeted requests."""
        return tuple(self.keys[i] for i in self.targets)

    def describe(self, s: Settings) -> str:
        """One line naming the request count, targets, policy and injection mode."""
        how = f"rate {s.rate}" if s.rate is not None else f"blocks {s.blocks or '-1'}"
        return f"{s.requests} requests, targets {list(self.targets)}, policy {s.policy}, {how}"


def workload(s: Settings, vocab_size: int) -> Workload:
    """The run's workload: reproducible prompts, their targets and prefix keys."""
    prompts = make_prompts(s.requests, s.seed, vocab_size)
    return Workload(tuple(tuple(p) for p in prompts), tuple(targets_of(s)), tuple(keys_of(prompts)))


# ---- outputs ----------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    """One request's completion: HTTP success, finish reason, token ids, logprobs or error."""

    ok: bool  # an HTTP 200 with a choice
    finish_reason: str | None = None
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    error: str | None = None

    @property
    def failed(self) -> bool:
        """True when the request got no choice or finished with ``error``."""
        return not self.ok or self.finish_reason == "error"

    def to_dict(self) -> dict:
        """The output as the report holds it (token ids and logprobs as lists)."""
        return record(self)


def output_from_response(status: int, body: Any) -> Output:
    """The :class:`Output` of one completions reply (HTTP status and JSON body)."""
    if status != 200 or not isinstance(body, dict):
        msg = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        return Output(False, error=f"HTTP {status}: {str(msg)[:200]}")
    try:
        choice = body["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        ids = tuple(
            int(t.split(":", 1)[1]) if isinstance(t, str) and t.startswith("token_id:") else -1
            for t in tokens
        )
        logprobs = tuple(float(x) for x in (lp.get("token_logprobs") or []))
        return Output(True, choice.get("finish_reason"), ids, logprobs)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return Output(False, error=f"malformed completion: {exc!r}")


@dataclass(frozen=True)
class Comparison:
    """How a request's output compares with its baseline output."""

    tokens_equal: bool
    logprobs_equal: bool
    max_logprob_diff: float | None
    first_divergence: int | None

    @property
    def identical(self) -> bool:
        """True when tokens and logprobs are both equal."""
        return self.tokens_equal and self.logprobs_equal


def compare(base: Output, other: Output) -> Comparison:
    """Compare ``other`` with the baseline ``base``: tokens, logprobs, first divergence."""
    if not base.ok or not other.ok:
        return Comparison(False, False, None, 0)
    tokens_equal = base.token_ids == other.token_ids and bool(base.token_ids)
    first = None
    for i, (a, b) in enumerate(zip(base.token_ids, other.token_ids, strict=False)):
        if a != b:
            first = i
            break
    if first is None and len(base.token_ids) != len(other.token_ids):
        first = min(len(base.token_ids), len(other.token_ids))
    diffs = [abs(a - b) for a, b in zip(base.logprobs, other.logprobs, strict=False)]
    logprobs_equal = base.logprobs == other.logprobs and len(base.logprobs) == len(base.token_ids)
    return Comparison(tokens_equal, logprobs_equal, max(diffs) if diffs else None, first)


# ---- engine accounting ---------------------------------------------------------------
@dataclass(frozen=True)
class Accounting:
    """Recovery counts from vLLM's own log lines, and those lines."""

    rescheduled_requests: int = 0
    recomputed_tokens: int = 0
    failed_requests: int = 0
    failed_tokens: int = 0
    lines: tuple[str, ...] = ()


def account(log_segment: str) -> Accounting:
    """Count rescheduled and failed requests and tokens from vLLM's own recovery lines.

    Sum vLLM's own recovery lines ("N request(s) rescheduled (M tokens affected)",
    "Failing N request(s) ... M tokens affected") in a slice of the server log.
    """
    rr = rt = fr = ft = 0
    lines = []
    for line in log_segment.splitlines():
        m = _RECOVERED.search(line)
        if m:
            rr, rt = rr + int(m.group(1)), rt + int(m.group(2))
            lines.append(line.strip()[-160:])
            continue
        m = _FAILING.search(line)
        if m:
            fr, ft = fr + int(m.group(1)), ft + int(m.group(2))
            lines.append(line.strip()[-160:])
    return Accounting(rr, rt, fr, ft, tuple(lines))


def death_lines(log_segment: str, limit: int = 3) -> list[str]:
    """The last distinct lines of the log slice that tell how the engine died."""
    out = []
    for line in log_segment.splitlines():
        if any(m in line for m in _DEATH):
            text = line.strip()
            if text not in out:
                out.append(text[-240:])
    return out[-limit:]


# ---- what the connector and the patch recorded ----------------------------------------
@dataclass(frozen=True, slots=True)
class Injection:
    """One block the connector injected (a ``kv_injections`` event)."""

    key: str | None
    group: int | None
    block: int | None
    position: int | None
    epoch: str | None
    reported: bool = True  # False: corrupted silently (the sensitivity phase)
    rank: int = 0  # the worker that injected it (TP/PP rank; every rank injects the same)

    @classmethod
    def from_event(cls, e: Mapping[str, Any]) -> Injection:
        """The injection an event of the connector records."""
        return cls(
            e.get("key"),
            e.get("group"),
            e.get("block"),
            e.get("position"),
            e.get("epoch"),
            bool(e.get("reported", True)),
            int(e.get("rank") or 0),
        )


@dataclass(frozen=True, slots=True)
class Transfer:
    """One store or load of a request's KV (a ``kv_transfers`` event)."""

    op: str | None
    key: str | None
    blocks: int
    epoch: str | None
    rank: int = 0  # the worker that moved its part of the KV

    @classmethod
    def from_event(cls, e: Mapping[str, Any]) -> Transfer:
        """The transfer an event of the connector records."""
        blocks, rank = int(e.get("blocks") or 0), int(e.get("rank") or 0)
        return cls(e.get("op"), e.get("key"), blocks, e.get("epoch"), rank)


LEAD_RANK = 0  # the rank whose injections are counted (every rank makes the same ones)


def lead(injections: Sequence[Injection]) -> list[Injection]:
    """The injections of the lead rank: one per injected block, whatever the ranks."""
    return [i for i in injections if i.rank == LEAD_RANK]


def rank_disagreement(injections: Sequence[Injection]) -> str | None:
    """How the ranks' injections differ; None when they agree.

    Each rank must fail the same blocks of the same requests, or the engine's ranks see
    different KV."""
    per_rank: dict[int, Counter] = {}
    for i in injections:
        per_rank.setdefault(i.rank, Counter())[(i.key, i.group, i.position, i.epoch)] += 1
    if len(per_rank) < 2:
        return None
    lead_set = per_rank.get(LEAD_RANK, Counter())
    odd = sorted(r for r, got in per_rank.items() if got != lead_set)
    if not odd:
        return None
    counts = ", ".join(f"rank {r}: {sum(c.values())}" for r, c in sorted(per_rank.items()))
    return f"rank(s) {odd} injected other blocks than rank {LEAD_RANK} ({counts})"


@dataclass(frozen=True, slots=True)
class Recovery:
    """One recovery by the kv_hybrid_recompute patch (a ``kv_recoveries`` event)."""

    action: str | None
    requests: int | None
    tokens: int | None
    groups: int | None
    policy: str | None

    @classmethod
    def from_event(cls, e: Mapping[str, Any]) -> Recovery:
        """The recovery an event of the patch records."""
        return cls(
            e.get("action"), e.get("requests"), e.get("tokens"), e.get("groups"), e.get("policy")
        )


def injected_blocks(
    injections: Sequence[Injection], keys: Sequence[str], epoch: str = "inject"
) -> dict[int, int]:
    """Request index -> blocks injected into it in ``epoch`` (requests with none left out)."""
    per_key = Counter(i.key for i in injections if i.epoch == epoch)
    return {i: per_key[k] for i, k in enumerate(keys) if per_key.get(k)}


def affected_requests(injections: Sequence[Injection], epoch: str = "inject") -> int:
    """Requests hit by at least one *reported* failure in ``epoch``."""
    return len({i.key for i in injections if i.epoch == epoch and i.reported})


def recovery_logged(log_segment: str, affected: int) -> bool:
    """Whether vLLM's own log lines account for every affected request.

    Rescheduled under recompute, failed under fail: the inject phase's log is then complete.
    """
    a = account(log_segment)
    return a.rescheduled_requests + a.failed_requests >= affected


def roundtrip_loads(transfers: Sequence[Transfer]) -> int:
    """Requests that reloaded KV blocks from the connector in the round-trip phase."""
    return len({t.key for t in transfers if t.op == "load" and t.epoch == "roundtrip" and t.blocks})


def recomputed_by_patch(recoveries: Sequence[Recovery]) -> int:
    """Tokens the patch reports as recomputed."""
    return sum(int(r.tokens or 0) for r in recoveries if r.action == "recomputed")


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """The change of each kv-fail metric between two snapshots."""
    return {k: (after.get(k) or 0) - (before.get(k) or 0) for k in METRICS}
