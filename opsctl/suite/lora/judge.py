"""`opsctl diag lora`, pure: LoRA adapters applied one at a time and in one mixed batch.

vLLM PR 55897: LoRA on multimodal towers; mixed-adapter batches must map each request
and each image to its own adapter. No I/O, no UI.

The plan: requests ``r0..rN`` cycle through the adapters and the base model (adapter
``None``); on a vision-language model each carries images, and two neighbouring requests
(different adapters) share their images, so one image meets two adapters in the batch.

- Single-adapter validation: every request runs alone with every adapter and with the
  base model; an adapter passes when its output differs from the base model's on at
  least one request (so it is really applied). Two adapters with identical outputs
  everywhere would hide a swap between them: the mixed case is then not conclusive.
- Mixed batch: all requests sent together; each output must equal the same request run
  alone with the same adapter: tokens exact, logprobs by the invariance rules
  (:func:`opsctl.suite.invariance.judge.compare`: bitwise unless ``atol``). The first
  divergence names the request, its adapter and its images. The batch probe must show
  that requests of different adapters were sampled in one step.
- Support per part (language model, vision tower, connector) is decided in
  :mod:`opsctl.suite.lora.judge_support`: an unsupported or unmeasured part is reported as
  such, never as a pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.records import record
from opsctl.suite.invariance import judge as inv
from opsctl.suite.invariance.judge_calibration import Calibration, run_diff

PASS, FAIL, UNVERIFIED = "pass", "fail", "unverified"
LANGUAGE, TOWER, CONNECTOR = "language", "tower", "connector"
PARTS = (LANGUAGE, TOWER, CONNECTOR)
APPLIED, SUPPORTED, UNSUPPORTED, NOT_ENABLED, UNKNOWN = (
    "applied",
    "supported",
    "unsupported",
    "not enabled",
    "unknown",
)
# an adapter "changes the output" when a token differs or a logprob moves by more than
# this (far above CPU batch noise, ~5e-7, far below what a real adapter does)
APPLIED_ATOL = 1e-3
BASE = "base"
PROBE_EVENTS = "lora"  # the lora probe's event file (events/lora.jsonl)
VALID_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's --max-lora-rank choices
PROMPTS = (
    "The quick brown fox jumps over the lazy dog",
    "Hello world, this is a test of",
    "Once upon a time there was",
    "vLLM serves large language models",
    "The cat sat on the mat and",
    "Numbers: one two three four",
    "A batch of prompts walks into a",
    "Images are described by captions:",
)
IMAGE_COLORS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("red", (220, 40, 40)),
    ("green", (40, 200, 60)),
    ("blue", (40, 60, 220)),
    ("yellow", (230, 210, 40)),
    ("magenta", (200, 40, 200)),
    ("cyan", (40, 200, 210)),
    ("orange", (240, 140, 30)),
    ("grey", (128, 128, 128)),
)


@dataclass(frozen=True, slots=True)
class LoraRequest:
    """One request of the check: its index, adapter (None: base model), prompt and images."""

    index: int
    adapter: str | None  # None: the base model
    prompt: str
    images: tuple[str, ...] = ()  # colour names (IMAGE_COLORS), in order

    @property
    def label(self) -> str:
        """The adapter's name, or the base model's label."""
        return self.adapter or BASE

    def with_adapter(self, adapter: str | None) -> LoraRequest:
        """The same request under another adapter."""
        return LoraRequest(self.index, adapter, self.prompt, self.images)

    def describe(self) -> str:
        """The request for a human line: ``r<i> (<adapter>, images ...)``."""
        imgs = f", images {'+'.join(self.images)}" if self.images else ""
        return f"r{self.index} ({self.label}{imgs})"

    def to_dict(self) -> dict[str, Any]:
        """The request as the report holds it (its images as a list)."""
        return record(self)


def plan_mixed(
    adapters: Sequence[str],
    images_per_request: int,
    per_group: int = 2,
    prompts: Sequence[str] = PROMPTS,
) -> tuple[LoraRequest, ...]:
    """The mixed batch: ``per_group`` requests per adapter and for the base model, interleaved.

    The order is r0 adapter 1, r1 adapter 2, ..., base, adapter 1, ... Requests 2k and 2k+1
    carry the same images (consecutive colours), under two different adapters. ``prompts``:
    the texts, in turn (a sweep's seed gives its own).
    """
    groups: list[str | None] = [*adapters, None]
    n = per_group * len(groups)
    out = []
    for i in range(n):
        images = tuple(
            IMAGE_COLORS[(i // 2 + j) % len(IMAGE_COLORS)][0] for j in range(images_per_request)
        )
        out.append(LoraRequest(i, groups[i % len(groups)], prompts[i % len(prompts)], images))
    return tuple(out)


def alone_plan(mixed: Sequence[LoraRequest], adapters: Sequence[str]) -> tuple[LoraRequest, ...]:
    """Every mixed request run alone with the base model and with every adapter."""
    return tuple(r.with_adapter(a) for a in (None, *adapters) for r in mixed)


def lora_rank(ranks: Sequence[int]) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds every adapter's rank."""
    top = max(ranks, default=8)
    for r in VALID_RANKS:
        if r >= top:
            return r
    raise ValueError(f"LoRA rank {top} is above vLLM's largest --max-lora-rank (512)")


def request_index(req_id: str, tag: str) -> int | None:
    """Which mixed request an engine request id belongs to (``...<tag>-mix-r<i>-...``)."""
    m = re.search(re.escape(tag) + r"-mix-r(\d+)-", req_id)
    return int(m[1]) if m else None


def is_alone(req_id: str, tag: str) -> bool:
    """Whether a request id is one of the check's alone requests (tag ``<tag>-one-r<i>-``)."""
    return re.search(re.escape(tag) + r"-one-r\d+-", req_id) is not None


# ---- single-adapter validation -----------------------------------------------------------

Key = tuple[str | None, int]  # (adapter, request index)
# field -> report key where the report names a record's field otherwise
SINGLE_KEYS = {"differs": "differs_from_base", "largest_diff": "largest_diff_while_tokens_agree"}
MIXED_KEYS = {
    "max_requests": "max_requests_per_step",
    "max_groups": "max_adapters_per_step",
    "groups": "adapters",
}


@dataclass(frozen=True, slots=True)
class SingleResult:
    """One adapter's verdict from its requests run alone against the base model."""

    adapter: str
    verdict: str
    requests: int
    differs: int  # requests whose output differs from the base model's
    largest_diff: float | None  # largest |Δlogprob| from base while tokens agreed
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """The adapter's row in the report (the counts under their report names)."""
        return record(self, SINGLE_KEYS)


def _differs(a: inv.Generated, b: inv.Generated, max_tokens: int, logprobs: int) -> bool | str:
    """True/False, or the fail-closed reason when one side is unusable."""
    r = inv.compare(0, a, b, max_tokens=max_tokens, logprobs=logprobs, atol=APPLIED_ATOL)
    if r.status == inv.ERROR:
        return r.reason
    return r.status == inv.DIVERGED


def judge_single(
    adapter: str,
    indexes: Sequence[int],
    alone: Mapping[Key, inv.Generated],
    *,
    max_tokens: int,
    logprobs: int,
) -> SingleResult:
    """Whether ``adapter`` changed the base model's output on the requests run alone."""
    differs, errors, largest = 0, [], None
    for i in indexes:
        r = inv.compare(
            i,
            alone[(None, i)],
            alone[(adapter, i)],
            max_tokens=max_tokens,
            logprobs=logprobs,
            atol=APPLIED_ATOL,
        )
        if r.status == inv.ERROR:
            errors.append(f"r{i}: {r.reason}")
            continue
        differs += int(r.status == inv.DIVERGED)
        if r.tokens_identical and r.largest_diff is not None:
            largest = r.largest_diff if largest is None else max(largest, r.largest_diff)
    n = len(indexes)
    if errors:
        return SingleResult(adapter, FAIL, n, differs, largest, "; ".join(errors))
    if differs == 0:
        why = f"output equals the base model's on all {n} requests: adapter not applied"
        return SingleResult(adapter, FAIL, n, 0, largest, why)
    return SingleResult(adapter, PASS, n, differs, largest, f"differs from base on {differs}/{n}")


def identical_pairs(
    adapters: Sequence[str],
    indexes: Sequence[int],
    alone: Mapping[Key, inv.Generated],
    *,
    max_tokens: int,
    logprobs: int,
) -> list[tuple[str, str]]:
    """Pairs of adapters whose outputs agree on every request.

    A swap between the two adapters of such a pair would go unseen.
    """
    out = []
    for x, a in enumerate(adapters):
        for b in adapters[x + 1 :]:
            if not any(
                _differs(alone[(a, i)], alone[(b, i)], max_tokens, logprobs) is True
                for i in indexes
            ):
                out.append((a, b))
    return out


# ---- the mixed batch -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MixedRow:
    """One request of the mixed batch: its comparison with its alone run, and a look-alike."""

    request: LoraRequest
    result: inv.PromptResult
    # a diverged output that equals this request run alone with another adapter (or the
    # base model): the request was served with that adapter
    looks_like: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as the report's ``mixed`` list holds it (request and result merged)."""
        return {
            **self.request.to_dict(),
            **self.result.to_dict(),
            "index": self.request.index,
            "looks_like": self.looks_like,
        }


def looks_like(
    req: LoraRequest,
    got: inv.Generated,
    alone: Mapping[Key, inv.Generated],
    labels: Sequence[str | None],
    *,
    max_tokens: int,
    logprobs: int,
) -> str | None:
    """The adapter (or "base") whose alone run ``got`` equals, other than its own; else None.

    Equal: tokens exact, logprobs within APPLIED_ATOL, on the same request.
    """
    for label in labels:
        if label == req.adapter or (label, req.index) not in alone:
            continue
        r = inv.compare(
            req.index,
            alone[(label, req.index)],
            got,
            max_tokens=max_tokens,
            logprobs=logprobs,
            atol=APPLIED_ATOL,
        )
        if r.passed:
            return label or BASE
    return None


def compare_mixed(
    mixed: Sequence[LoraRequest],
    alone: Mapping[Key, inv.Generated],
    batched: Sequence[inv.Generated],
    *,
    max_tokens: int,
    logprobs: int,
    atol: float | None,
) -> list[MixedRow]:
    """Each batched output against the same request run alone with the same adapter.

    A diverged one is also matched against the other adapters' alone runs.
    """
    labels = list(dict.fromkeys([None, *(r.adapter for r in mixed)]))
    rows = []
    for r, got in zip(mixed, batched, strict=True):
        kw = {"max_tokens": max_tokens, "logprobs": logprobs}
        res = inv.compare(r.index, alone[(r.adapter, r.index)], got, atol=atol, **kw)
        like = None if res.passed else looks_like(r, got, alone, labels, **kw)
        rows.append(MixedRow(r, res, like))
    return rows


def first_divergence(rows: Sequence[MixedRow]) -> dict[str, Any] | None:
    """The first request that did not match: its adapter, images and where it diverged."""
    for row in rows:
        if not row.result.passed:
            d = row.result.first_divergence
            return {
                "request": row.request.index,
                "adapter": row.request.label,
                "images": list(row.request.images),
                "prompt": row.request.prompt,
                "status": row.result.status,
                "position": d.position if d else None,
                "kind": d.kind if d else None,
                "text": inv.divergence_text(row.result),
                "looks_like": row.looks_like,
            }
    return None


@dataclass(frozen=True, slots=True)
class MixedEvidence:
    """What the probe shows of the mixed batch: steps that mixed adapters, and those apart."""

    source: str  # "batch probe" | "none"
    steps: int  # sampling steps that held mixed requests
    max_requests: int  # most mixed requests sampled in one step
    max_groups: int  # most distinct adapters (base counted) in one step
    groups: int  # distinct adapters (base counted) in the mixed batch
    apart: tuple[int, ...] = ()  # requests never sampled with another adapter's request

    @property
    def formed(self) -> bool | None:
        """Every request met another adapter's request in a step (None: no records)."""
        if self.source == "none":
            return None
        return self.max_groups >= min(self.groups, 2) and not self.apart

    def to_dict(self) -> dict[str, Any]:
        """The evidence as the report holds it, ``formed`` last."""
        return record(self, MIXED_KEYS) | {"formed": self.formed}


def mixed_evidence(
    steps: Sequence[Mapping[str, Any]],
    tag: str,
    mixed: Sequence[LoraRequest],
    *,
    event: str = "step",
    source: str = "batch probe",
) -> MixedEvidence:
    """Whether requests of different adapters were sampled in one step, from probe records.

    The batch probe's step records; ``apart``: requests that never were. With
    ``event="encoder"`` and the lora probe's encoder records: whose images ran the vision
    tower together.
    """
    label = {r.index: r.label for r in mixed}
    n_steps, most, most_groups = 0, 0, 0
    met: dict[int, bool] = dict.fromkeys(label, False)
    for s in steps:
        if s.get("event") != event:
            continue
        ours = {
            i for i in (request_index(str(r), tag) for r in s.get("req_ids") or []) if i in label
        }
        if not ours:
            continue
        n_steps += 1
        in_step = {label[i] for i in ours}
        most, most_groups = max(most, len(ours)), max(most_groups, len(in_step))
        for i in ours:
            met[i] = met[i] or len(in_step - {label[i]}) > 0
    groups = len(set(label.values()))
    if n_steps == 0:
        return MixedEvidence("none", 0, 0, 0, groups)
    apart = tuple(sorted(i for i, ok in met.items() if not ok))
    return MixedEvidence(source, n_steps, most, most_groups, groups, apart)


def alone_shared(steps: Sequence[Mapping[str, Any]], tag: str) -> int:
    """Largest step (any requests) that held one of the check's alone requests.

    Above 1, other traffic shared it, so that side was not strictly alone.
    """
    best = 0
    for s in steps:
        ids = [str(r) for r in s.get("req_ids") or []] if s.get("event") == "step" else []
        if any(is_alone(r, tag) for r in ids):
            best = max(best, len(ids))
    return best


# ---- the verdict ------------------------------------------------------------------------------


def _row_reason(r: MixedRow) -> str:
    text = inv.divergence_text(r.result) if r.result.first_divergence else r.result.reason
    line = f"mixed batch {r.request.describe()}: {text}"
    if r.looks_like:
        line += f"; its output equals this request run alone with {r.looks_like}"
    return line


def slot_hint(failed: Sequence[MixedRow]) -> str | None:
    """The hint that a no-adapter row was read as a LoRA slot, when the failures show it.

    When every failed request is a base-model request, and those whose output equals
    another adapter's all got one same adapter (the others got it only in some of their
    steps): the signature of a no-adapter row read as a LoRA slot (vLLM's torch LoRA ops,
    used on CPU, index the stacked weights with -1, i.e. the last slot; upstream PR
    48421).
    """
    seen = {r.looks_like for r in failed} - {None}
    if not failed or any(r.request.adapter is not None for r in failed) or len(seen) != 1:
        return None
    (adapter,) = seen
    return (
        f"base-model requests batched with LoRA requests were served (in the steps they "
        f"shared with them) with adapter {adapter}: "
        "a no-adapter row read as the last LoRA slot (vLLM's torch LoRA ops index -1; "
        "upstream PR 48421); a free LoRA slot (--max-loras above the adapters in use) avoids it"
    )


@dataclass(frozen=True, slots=True)
class Findings:
    """The check's verdict, the reasons and warnings, and the mixed batch's own verdict."""

    verdict: str
    reasons: tuple[str, ...]  # why it failed / is not conclusive
    warnings: tuple[str, ...]
    mixed_verdict: str


def assess(
    single: Sequence[SingleResult],
    rows: Sequence[MixedRow],
    evidence: MixedEvidence,
    *,
    same_pairs: Sequence[tuple[str, str]] = (),
    alone_shared_max: int = 0,
    swaps: Sequence[Mapping[str, Any]] = (),
    tower: MixedEvidence | None = None,
    earlier: Sequence[Sequence[MixedRow]] = (),
) -> Findings:
    """The check's verdict (pass, fail or unverified) with its reasons and warnings.

    fail: an adapter not applied, a request error, a mixed output that differs from
    its alone run, or a batch the probe shows never mixed adapters. unverified: the batch
    could not be shown (no probe), two adapters are indistinguishable, or (``tower``: the
    encoder calls, vision-language models) no encoder call mixed two adapters' images.
    ``earlier``: the rows of earlier sends of the mixed batch (resent because they did
    not mix adapters): a divergence there fails too. Else pass.
    """
    reasons = [f"adapter {s.adapter}: {s.detail}" for s in single if s.verdict != PASS]
    mixed_fail = [r for r in rows if not r.result.passed]
    reasons += [_row_reason(r) for r in mixed_fail]
    for k, sent in enumerate(earlier, 1):  # earlier sends that did not mix adapters
        failed = [r for r in sent if not r.result.passed]
        mixed_fail += failed
        reasons += [f"attempt {k}: {_row_reason(r)}" for r in failed]
    if hint := slot_hint(mixed_fail):
        reasons.append(hint)
    inconclusive: list[str] = []
    if evidence.formed is False:
        reasons.append(
            f"the batch probe never showed requests of different adapters in one step "
            f"(apart: {list(evidence.apart)}, at most {evidence.max_groups} adapter(s) per step)"
        )
    elif evidence.formed is None:
        inconclusive.append("no batch probe on this server: the mixed batch is not shown")
    for a, b in same_pairs:
        inconclusive.append(f"adapters {a} and {b} give identical outputs: a swap is unseen")
    if tower is not None and tower.source == "none":
        inconclusive.append("no lora probe record of the vision encoder calls")
    elif tower is not None and tower.max_groups < 2:
        inconclusive.append(
            "no vision encoder call ran images of two adapters together: the tower's "
            "per-image adapter mapping was not exercised"
        )
    warnings = list(inconclusive)
    if alone_shared_max > 1:
        warnings.append(
            f"an alone request shared a step with {alone_shared_max - 1} other request(s) "
            "(other traffic on this server)"
        )
    if swaps:
        warnings.append(f"TEST KNOB OPSCTL_LORA_SWAP swapped adapters {len(swaps)} time(s)")
    mixed_verdict = FAIL if mixed_fail or evidence.formed is False else PASS
    if mixed_verdict == PASS and inconclusive:
        mixed_verdict = UNVERIFIED
    if reasons:
        return Findings(FAIL, tuple(reasons), tuple(warnings), mixed_verdict)
    if inconclusive:
        return Findings(UNVERIFIED, tuple(inconclusive), tuple(warnings), mixed_verdict)
    return Findings(PASS, (), tuple(warnings), mixed_verdict)


# ---- calibration (opsctl.suite.invariance.judge_calibration's rule) ----------------------


def calibration(
    alone: Mapping[Key, inv.Generated],
    control: Mapping[int, inv.Generated],
    adapters: Sequence[str],
    indexes: Sequence[int],
    *,
    max_tokens: int,
    atol: float | None,
) -> Calibration:
    """The floor (base requests alone, twice) and sensitivity (adapter vs adapter) of a run.

    The sensitivity is the smallest difference between two adapters' outputs of the same
    requests: what a swap between them looks like. A pair's difference is its largest over the requests (inf: a token differs); the
    sensitivity is the smallest over the pairs (0: a swap between them is unseen)."""
    pairs = [(alone[(None, i)], control[i]) for i in indexes if i in control]
    floor = max((run_diff(a, b, max_tokens) for a, b in pairs), default=0.0)
    effects = [
        max(run_diff(alone[(a, i)], alone[(b, i)], max_tokens) for i in indexes)
        for x, a in enumerate(adapters)
        for b in adapters[x + 1 :]
    ]
    sensitivity = min(effects) if effects else None
    return Calibration(floor, sensitivity, atol, len(pairs), len(effects))
