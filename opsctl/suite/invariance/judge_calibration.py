"""Comparisons calibrated on the engine they judge: a noise floor, a sensitivity, one rule.

Pure. Used by ``diag invariance`` and ``diag lora`` (issue 45 item 1); the same rule on CPU
and CUDA, bf16 and fp32, because every bound is measured on the engine under test, never
assumed from its platform or dtype.

- **floor** F: the largest |Δlogprob| between two runs of the same requests with no fault
  (invariance: every prompt alone, twice; lora: the base model alone, twice). Infinite when
  the two runs differ in a token: the engine is not even repeatable.
- **sensitivity** S: the smallest |Δlogprob| a real, planted difference causes (invariance:
  each probe prompt against the same prompt with a few words more, at the first generated
  position; lora: two adapters on the same request). It is what a fault of the smallest
  kind the check claims to see looks like on this engine. A probe that moved nothing
  planted nothing and is not counted; none that moved: no sensitivity (inconclusive).
- **bound** B = max(HEADROOM x F, atol or 0): a compared result within B matches. F is the
  largest of one sample of no-fault differences; the same noise in the judged sample can
  exceed that maximum, so the bound leaves HEADROOM (2x) above it. With F = 0 and no
  ``atol`` (CPU float32: measured bitwise) the comparison stays bitwise.

The rule: the comparison is **conclusive** when S > MARGIN x B (a fault stands clearly above
the noise). Then a result within B is ``pass`` and one beyond B (or a different token) is
``fail``. When it is not conclusive the verdict is ``inconclusive`` (never a pass) and the
report says what would make it conclusive. MARGIN is 10: kv-fail on a hybrid model on an
H100 measured 35-80x between noise and effect, a margin a right check must accept, and a
floor within a factor 10 of the effect cannot tell the two apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.suite.invariance.judge import Generated

MARGIN = 10.0  # a fault must move outputs more than MARGIN x the bound to be told from noise
HEADROOM = 2.0  # the bound over the floor: one sample's maximum, the judged one may exceed it
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
# what makes a noisy comparison conclusive (said with every inconclusive verdict)
REMEDY = (
    "serve the model in float32, run with --mode eager, compare more tokens (--max-tokens), "
    "or state a tolerance (--atol) only where the floor justifies it"
)
# words appended to a probe prompt: a real, small difference in the request
PROBE_SUFFIX = " and then"


def run_diff(a: Generated, b: Generated, positions: int) -> float:
    """The largest |Δlogprob| between two runs of one request (sampled and common top-k).

    ``math.inf`` when a token differs within ``positions``; 0.0 for bitwise equal outputs.
    Outputs that cannot be compared (an error, too few tokens) are ``math.inf`` too."""
    if a.error or b.error:
        return math.inf
    n = min(positions, len(a.token_ids), len(b.token_ids), len(a.logprobs), len(b.logprobs))
    if n < positions:
        return math.inf
    largest = 0.0
    for pos in range(n):
        if a.token_ids[pos] != b.token_ids[pos]:
            return math.inf
        largest = max(largest, _position_diff(a, b, pos))
    return largest


def first_position_effect(a: Generated, b: Generated) -> float | None:
    """How far two different requests' first generated positions are apart (|Δlogprob|).

    The largest difference of the sampled token's logprob and of every token in both top-k
    lists at position 0; None when either output has no first position."""
    if a.error or b.error or not a.logprobs or not b.logprobs:
        return None
    if a.logprobs[0] is None or b.logprobs[0] is None:
        return None
    return _position_diff(a, b, 0)


def _position_diff(a: Generated, b: Generated, pos: int) -> float:
    la, lb = a.logprobs[pos], b.logprobs[pos]
    diffs = [abs(float(la) - float(lb))] if la is not None and lb is not None else []
    top_a = a.top_logprobs[pos] if pos < len(a.top_logprobs) else None
    top_b = b.top_logprobs[pos] if pos < len(b.top_logprobs) else None
    if top_a and top_b:
        diffs += [abs(top_a[t] - top_b[t]) for t in set(top_a) & set(top_b)]
    return max(diffs, default=0.0)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The floor and sensitivity one run measured, the bound they give and the rule's answer."""

    floor: float  # largest no-fault |Δ| (inf: a token differed between two no-fault runs)
    sensitivity: float | None  # smallest planted |Δ| (None: nothing could be planted)
    atol: float | None = None  # the operator's tolerance, if any
    floor_runs: int = 0  # requests compared for the floor
    probes: int = 0  # planted differences measured

    @property
    def bound(self) -> float:
        """A compared result within this matches: max(HEADROOM x floor, atol or 0)."""
        return max(HEADROOM * self.floor, self.atol or 0.0)

    @property
    def bitwise(self) -> bool:
        """True when the comparison stays bitwise (no floor, no atol)."""
        return self.bound == 0.0

    @property
    def ratio(self) -> float | None:
        """sensitivity / bound (inf for a bitwise bound and any effect; None: unknown)."""
        if self.sensitivity is None or math.isinf(self.floor):
            return None
        if self.bound == 0.0:
            return math.inf if self.sensitivity > 0 else None
        return self.sensitivity / self.bound

    @property
    def conclusive(self) -> bool:
        """True when a fault of the planted size stands more than MARGIN x above the bound."""
        r = self.ratio
        return r is not None and r > MARGIN

    def atol_for_compare(self) -> float | None:
        """The tolerance results are compared with: None (bitwise) or the bound."""
        return None if self.bitwise else self.bound

    def why_inconclusive(self) -> str:
        """One line: why this comparison cannot tell a right result from a wrong one."""
        if math.isinf(self.floor):
            what = "two runs of the same requests with no fault differ in a token"
        elif self.sensitivity is None:
            what = "no planted difference could be measured"
        else:
            what = (
                f"the smallest planted difference ({fmt(self.sensitivity)}) is not more than "
                f"{MARGIN:g}x the bound ({fmt(self.bound)}: {HEADROOM:g}x the noise floor "
                f"{fmt(self.floor)}, or --atol)"
            )
        return f"inconclusive: {what}; to make it conclusive {REMEDY}"

    def judge(self, matched: bool) -> str:
        """The verdict of a comparison whose results matched (within the bound) or not."""
        if not self.conclusive:
            return INCONCLUSIVE
        return PASS if matched else FAIL

    def to_dict(self) -> dict[str, Any]:
        """The calibration as reports hold it (inf written as null with a reason)."""
        return {
            "floor": None if math.isinf(self.floor) else self.floor,
            "floor_tokens_differ": math.isinf(self.floor),
            "sensitivity": _finite(self.sensitivity),
            "sensitivity_tokens_differ": self.sensitivity is not None
            and math.isinf(self.sensitivity),
            "bound": None if math.isinf(self.bound) else self.bound,
            "bitwise": self.bitwise,
            "ratio": _finite(self.ratio),
            "margin": MARGIN,
            "conclusive": self.conclusive,
            "floor_runs": self.floor_runs,
            "probes": self.probes,
        }


def calibrate(
    pairs: Iterable[tuple[Generated, Generated]],
    effects: Sequence[float | None],
    positions: int,
    atol: float | None = None,
) -> Calibration:
    """The calibration of no-fault ``pairs`` (the floor) and planted ``effects`` (sensitivity)."""
    pairs = list(pairs)
    floor = max((run_diff(a, b, positions) for a, b in pairs), default=0.0)
    seen = [e for e in effects if e]  # a probe that moved nothing planted nothing
    return Calibration(floor, min(seen) if seen else None, atol, len(pairs), len(seen))


def probe_prompt(prompt: str) -> str:
    """The planted request of a probe: ``prompt`` with a few words more."""
    return prompt + PROBE_SUFFIX


def fmt(x: float | None) -> str:
    """A difference for a line: ``-``, ``0``, ``inf`` or three significant digits."""
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else ("0" if x == 0 else f"{x:.3g}")


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def sweep_verdict(verdicts: Sequence[str]) -> str:
    """A sweep's verdict: the worst of its seeds'.

    fail if any seed failed, else inconclusive if any was, else the first other verdict
    that is not a pass (unverified), else pass."""
    if not verdicts:
        return FAIL
    for worst in (FAIL, INCONCLUSIVE):
        if worst in verdicts:
            return worst
    return next((v for v in verdicts if v != PASS), PASS)


def sweep_totals(verdicts: Sequence[str]) -> dict[str, int]:
    """How many seeds said pass, fail and inconclusive (not judged: unverified counts here)."""
    out = {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}
    for v in verdicts:
        out[v if v in out else INCONCLUSIVE] += 1
    return out


# words the seeded prompt sets are made of (a seed picks subject, verb and object per prompt)
_SUBJECTS = (
    "The old sailor", "A small robot", "My neighbour", "The quick brown fox", "An engineer",
    "The river", "A tired student", "The city council", "Our team", "The cat",
    "A distant star", "The teacher", "The engine", "A young painter", "The library",
)  # fmt: skip
_VERBS = (
    "walked towards", "looked at", "wrote about", "dreamed of", "argued with",
    "counted", "built", "painted", "listened to", "explained",
)  # fmt: skip
_OBJECTS = (
    "the quiet harbour", "seven green apples", "the broken clock", "a long letter",
    "the mountain road", "the first snow", "an empty room", "the evening news",
    "a strange machine", "the last train", "a field of wheat", "the map of the world",
)  # fmt: skip


def seeded_prompts(seed: int, count: int) -> tuple[str, ...]:
    """``count`` distinct prompts for ``seed`` (deterministic: the same seed, the same set)."""
    import random  # pure: a seeded generator, no global state

    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        p = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} and"
        if p not in out:
            out.append(p)
    return tuple(out)
