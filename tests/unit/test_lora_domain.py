"""diag lora's pure decisions: the request plan, single-adapter validation, the mixed
batch against the alone runs (invariance tolerance rules), which adapter a diverged
request got, the batch evidence, support per part and the verdict."""

from __future__ import annotations

import pytest

from opsctl.suite.invariance import judge as inv
from opsctl.suite.lora import judge as D
from opsctl.suite.lora import judge_support as DS
from opsctl.suite.lora.run import COLUMNS, table_rows

TAG = "opsctl-lora-abc123"
N = 4  # tokens per request in these tests


def gen(seed: int, *, shift: float = 0.0, error: str | None = None) -> inv.Generated:
    """A completion whose tokens and logprobs depend on ``seed`` (``shift``: move every
    logprob, the tokens stay)."""
    if error:
        return inv.Generated(error=error)
    toks = tuple(seed * 10 + i for i in range(N))
    lps = tuple(-1.0 - seed / 100 - i / 10 + shift for i in range(N))
    tops = tuple({t: lp, t + 1: lp - 1.0} for t, lp in zip(toks, lps, strict=True))
    return inv.Generated(toks, lps, tops, "length")


ADAPTERS = ["alpha", "beta"]
SEEDS = {None: 1, "alpha": 2, "beta": 3}


def alone_runs(mixed, seeds=SEEDS) -> dict:
    return {(a, r.index): gen(seeds[a] * 100 + r.index) for a in (None, *ADAPTERS) for r in mixed}


KW = {"max_tokens": N, "logprobs": 2}


# ---- plan -----------------------------------------------------------------------------------


def test_mixed_plan_interleaves_adapters_and_base_and_shares_images() -> None:
    mixed = D.plan_mixed(["alpha", "beta", "vision"], images_per_request=2)
    assert [r.label for r in mixed] == ["alpha", "beta", "vision", "base"] * 2
    assert mixed[0].images == mixed[1].images == ("red", "green")
    assert mixed[2].images == ("green", "blue") and mixed[0].adapter != mixed[1].adapter
    assert len({r.prompt for r in mixed}) == len(mixed)
    assert D.plan_mixed(["a", "b"], 0)[0].images == ()
    alone = D.alone_plan(mixed, ["alpha", "beta", "vision"])
    assert len(alone) == 4 * len(mixed) and {r.adapter for r in alone} == {
        None,
        "alpha",
        "beta",
        "vision",
    }


@pytest.mark.parametrize("ranks,want", [([8, 8], 8), ([4], 8), ([16, 8], 16), ([], 8), ([33], 64)])
def test_lora_rank_is_a_value_vllm_accepts(ranks, want) -> None:
    assert D.lora_rank(ranks) == want


def test_lora_rank_above_vllm_max_is_refused() -> None:
    with pytest.raises(ValueError):
        D.lora_rank([1024])


def test_request_ids() -> None:
    assert D.request_index(f"chatcmpl-{TAG}-mix-r3-beta-0a1b2c3d-99", TAG) == 3
    assert D.request_index(f"cmpl-{TAG}-one-r3-beta-0a1b2c3d-0", TAG) is None
    assert D.request_index("cmpl-other-mix-r3-x", TAG) is None
    assert D.is_alone(f"cmpl-{TAG}-one-r0-base-0a1b2c3d-0", TAG)


# ---- single-adapter validation ----------------------------------------------------------------


def test_single_adapter_applied_when_its_output_differs_from_base() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    res = D.judge_single("alpha", [r.index for r in mixed], alone, **KW)
    assert res.verdict == D.PASS and res.differs == len(mixed) == res.requests


def test_single_adapter_equal_to_base_is_not_applied() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed, {None: 1, "alpha": 1, "beta": 3})
    res = D.judge_single("alpha", [r.index for r in mixed], alone, **KW)
    assert res.verdict == D.FAIL and "not applied" in res.detail and res.differs == 0
    # batch noise far below APPLIED_ATOL does not count as "applied"
    alone = {k: (gen(100 + k[1], shift=1e-6) if k[0] == "alpha" else v) for k, v in alone.items()}
    assert D.judge_single("alpha", [r.index for r in mixed], alone, **KW).verdict == D.FAIL


def test_single_adapter_request_error_fails_closed() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    alone[("beta", 2)] = gen(0, error="HTTP 404: adapter not found")
    res = D.judge_single("beta", [r.index for r in mixed], alone, **KW)
    assert res.verdict == D.FAIL and "r2: " in res.detail and "HTTP 404" in res.detail


def test_identical_adapters_are_flagged() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    idx = [r.index for r in mixed]
    assert D.identical_pairs(ADAPTERS, idx, alone_runs(mixed), **KW) == []
    same = alone_runs(mixed, {None: 1, "alpha": 2, "beta": 2})
    assert D.identical_pairs(ADAPTERS, idx, same, **KW) == [("alpha", "beta")]


# ---- mixed batch --------------------------------------------------------------------------


def test_mixed_equal_to_alone_passes_bitwise() -> None:
    mixed = D.plan_mixed(ADAPTERS, 2)
    alone = alone_runs(mixed)
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    rows = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    assert all(r.result.status == inv.IDENTICAL for r in rows) and D.first_divergence(rows) is None


def test_mixed_logprob_noise_uses_the_invariance_tolerance() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    batched = [gen(SEEDS[r.adapter] * 100 + r.index, shift=4e-7) for r in mixed]
    bitwise = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    assert {r.result.status for r in bitwise} == {inv.DIVERGED}
    within = D.compare_mixed(mixed, alone, batched, atol=1e-6, **KW)
    assert {r.result.status for r in within} == {inv.WITHIN_ATOL}


def test_swapped_requests_are_named_with_the_adapter_they_got() -> None:
    mixed = D.plan_mixed(ADAPTERS, 2)  # r0 alpha, r1 beta (same images), r2 base, ...
    alone = alone_runs(mixed)
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    batched[0], batched[1] = alone[("beta", 0)], alone[("alpha", 1)]
    rows = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    assert [r.looks_like for r in rows[:3]] == ["beta", "alpha", None]
    first = D.first_divergence(rows)
    assert first is not None
    assert (first["request"], first["adapter"], first["images"]) == (0, "alpha", ["red", "green"])
    assert (first["position"], first["kind"], first["looks_like"]) == (0, "token", "beta")
    assert D.slot_hint([r for r in rows if not r.result.passed]) is None  # not base rows


def test_base_requests_served_with_one_adapter_give_the_slot_hint() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    batched = [alone[("beta" if r.adapter is None else r.adapter, r.index)] for r in mixed]
    rows = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    failed = [r for r in rows if not r.result.passed]
    assert [r.request.label for r in failed] == ["base", "base"]
    assert {r.looks_like for r in failed} == {"beta"}
    hint = D.slot_hint(failed)
    assert hint and "adapter beta" in hint and "48421" in hint


def test_mixed_error_fails_closed() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    batched[4] = gen(0, error="ReadTimeout: timed out")
    rows = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    assert rows[4].result.status == inv.ERROR and rows[4].looks_like is None


# ---- engine-side evidence -------------------------------------------------------------------


def step(*indexes: int, event: str = "step", phase: str = "mix", mixed=None) -> dict:
    mixed = mixed or D.plan_mixed(ADAPTERS, 0)
    ids = [f"cmpl-{TAG}-{phase}-r{i}-{mixed[i].label}-0a1b2c3d-0" for i in indexes]
    return {"event": event, "req_ids": [*ids, "cmpl-someone-else"]}


def test_batch_evidence_from_the_probe() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    ev = D.mixed_evidence([step(0, 1, 2, 3, 4, 5), step(0, 1)], TAG, mixed)
    assert ev.formed and (ev.max_requests, ev.max_groups, ev.groups, ev.steps) == (6, 3, 3, 2)
    apart = D.mixed_evidence([step(0, 2), step(1), step(3, 5), step(4)], TAG, mixed)
    assert apart.formed is False and apart.apart == (1, 4)  # r1, r4 (beta) never mixed
    none = D.mixed_evidence([], TAG, mixed)
    assert none.formed is None and none.source == "none"
    enc = D.mixed_evidence(
        [step(0, 1, 2, event="encoder"), step(3)], TAG, mixed, event="encoder", source="lora probe"
    )
    assert enc.source == "lora probe" and enc.max_groups == 3 and enc.steps == 1


def test_alone_requests_sharing_steps_are_counted() -> None:
    assert D.alone_shared([step(0, phase="one")], TAG) == 2  # with someone else's request
    assert D.alone_shared([step(0, 1)], TAG) == 0


# ---- verdict --------------------------------------------------------------------------------


def passing():
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    idx = [r.index for r in mixed]
    single = [D.judge_single(a, idx, alone, **KW) for a in ADAPTERS]
    rows = D.compare_mixed(
        mixed, alone, [alone[(r.adapter, r.index)] for r in mixed], atol=None, **KW
    )
    return mixed, alone, single, rows, D.mixed_evidence([step(0, 1, 2, 3, 4, 5)], TAG, mixed)


def test_assess_pass() -> None:
    _, _, single, rows, ev = passing()
    found = D.assess(single, rows, ev)
    assert (found.verdict, found.mixed_verdict, found.reasons) == (D.PASS, D.PASS, ())


def test_assess_fails_on_a_divergence_an_unapplied_adapter_or_an_unmixed_batch() -> None:
    mixed, alone, single, rows, ev = passing()
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    batched[1] = alone[("alpha", 1)]
    bad = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    found = D.assess(single, bad, ev)
    assert found.verdict == D.FAIL and found.mixed_verdict == D.FAIL
    assert found.reasons[0].startswith("mixed batch r1 (beta): pos 0 token")
    assert "equals this request run alone with alpha" in found.reasons[0]
    unapplied = [single[0], D.SingleResult("beta", D.FAIL, 6, 0, None, "not applied")]
    assert D.assess(unapplied, rows, ev).reasons == ("adapter beta: not applied",)
    apart = D.mixed_evidence([step(0), step(1), step(2)], TAG, mixed)
    found = D.assess(single, rows, apart)
    assert (
        found.verdict == D.FAIL
        and "never showed requests of different adapters" in found.reasons[0]
    )


def test_assess_unverified_without_evidence_or_with_indistinguishable_adapters() -> None:
    mixed, _, single, rows, _ = passing()
    found = D.assess(single, rows, D.mixed_evidence([], TAG, mixed))
    assert (
        found.verdict == D.UNVERIFIED == found.mixed_verdict
        and "no batch probe" in found.reasons[0]
    )
    _, _, single, rows, ev = passing()
    found = D.assess(single, rows, ev, same_pairs=[("alpha", "beta")])
    assert found.verdict == D.UNVERIFIED and "swap is unseen" in found.reasons[0]
    no_mix = D.mixed_evidence([step(0, event="encoder")], TAG, mixed, event="encoder")
    found = D.assess(single, rows, ev, tower=no_mix)
    assert found.verdict == D.UNVERIFIED and "tower's per-image adapter mapping" in found.reasons[0]


def test_assess_warnings() -> None:
    _, _, single, rows, ev = passing()
    found = D.assess(single, rows, ev, alone_shared_max=3, swaps=[{"event": "swap"}])
    assert found.verdict == D.PASS
    assert any("shared a step with 2 other" in w for w in found.warnings)
    assert any("OPSCTL_LORA_SWAP" in w for w in found.warnings)


# ---- support per part -----------------------------------------------------------------------

MANAGER = {
    "enable_tower_connector_lora": True,
    "tower_connector_lora": True,
    "wrapped": {"language": ["l"] * 8, "tower": ["t"] * 4, "connector": ["c"]},
}
PARTS = {"alpha": ("language", "tower", "connector"), "vision": ("tower", "connector")}


def single(adapter: str, verdict: str = D.PASS) -> D.SingleResult:
    return D.SingleResult(adapter, verdict, 8, 8 if verdict == D.PASS else 0, None, "")


def test_support_applied_only_when_measured() -> None:
    got = DS.support(True, MANAGER, [], PARTS, [single("alpha"), single("vision")])
    assert [(p.part, p.status, p.wrapped) for p in got] == [
        ("language", DS.APPLIED, 8),
        ("tower", DS.APPLIED, 4),
        ("connector", DS.APPLIED, 1),
    ]
    # without a tower-only adapter the tower is "supported" (wrapped), not "applied"
    got = DS.support(True, MANAGER, [], PARTS, [single("alpha"), single("vision", D.FAIL)])
    assert [p.status for p in got] == [DS.APPLIED, DS.SUPPORTED, DS.SUPPORTED]


def test_support_unsupported_not_enabled_unknown() -> None:
    blip2 = {**MANAGER, "wrapped": {"language": ["l"] * 10, "tower": ["t"] * 3}}
    adapters = [{"name": "x", "parts": {"connector": {"modules": 2, "applied": 0}}}]
    got = {p.part: p for p in DS.support(True, blip2, adapters, PARTS, [single("vision")])}
    assert got["connector"].status == DS.UNSUPPORTED and got["connector"].wrapped == 0
    assert (
        "no connector module" in got["connector"].detail
        and "2 adapter module(s)" in got["connector"].detail
    )
    assert got["tower"].status == DS.APPLIED
    off = {**MANAGER, "enable_tower_connector_lora": False}
    got = DS.support(True, off, [], PARTS, [])
    assert [p.status for p in got][1:] == [DS.NOT_ENABLED, DS.NOT_ENABLED]
    refused = {**MANAGER, "tower_connector_lora": False}
    assert DS.support(True, refused, [], PARTS, [])[1].status == DS.UNSUPPORTED
    partial = [{"name": "x", "parts": {"tower": {"modules": 6, "applied": 4}}}]
    assert DS.support(True, MANAGER, partial, PARTS, [])[1].status == DS.UNSUPPORTED
    got = DS.support(True, None, [], {}, [single("alpha")])
    assert [p.status for p in got] == [DS.UNKNOWN] * 3  # no probe, adapters of unknown parts
    assert [p.part for p in DS.support(False, MANAGER, [], PARTS, [])] == ["language"]


def test_engine_summary_and_table() -> None:
    assert DS.engine_summary(None, None) is None
    s = DS.engine_summary(
        {**MANAGER, "compilation_mode": "0", "max_loras": 3}, {"enforce_eager": False}
    )
    assert s is not None
    assert (s["compilation_mode"], s["enforce_eager"], s["max_loras"]) == ("NONE", False, 3)
    assert s["wrapped_modules"] == {"language": 8, "tower": 4, "connector": 1}
    _, _, singles, rows, _ = passing()
    table = table_rows(singles, rows, DS.support(False, MANAGER, [], PARTS, singles))
    assert table[0][:4] == ("support: language", "-", "-", DS.APPLIED)
    assert [r[0] for r in table].count("mixed") == len(rows)
    assert all(len(r) == len(COLUMNS) for r in table)


def test_slot_hint_when_some_base_requests_got_the_adapter_only_in_part() -> None:
    mixed = D.plan_mixed(ADAPTERS, 0)
    alone = alone_runs(mixed)
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    batched[2] = alone[("beta", 2)]
    batched[5] = gen(999)  # neither base nor any adapter alone: a mix of steps
    failed = [
        r for r in D.compare_mixed(mixed, alone, batched, atol=None, **KW) if not r.result.passed
    ]
    assert [(r.request.index, r.looks_like) for r in failed] == [(2, "beta"), (5, None)]
    assert "adapter beta" in (D.slot_hint(failed) or "")
    batched[5] = alone[("alpha", 5)]  # two different adapters: no single slot to blame
    failed = [
        r for r in D.compare_mixed(mixed, alone, batched, atol=None, **KW) if not r.result.passed
    ]
    assert D.slot_hint(failed) is None


def test_a_divergence_in_an_earlier_send_fails_too() -> None:
    mixed, alone, single, rows, ev = passing()
    batched = [alone[(r.adapter, r.index)] for r in mixed]
    batched[3] = alone[("beta", 3)]
    earlier = D.compare_mixed(mixed, alone, batched, atol=None, **KW)
    found = D.assess(single, rows, ev, earlier=[earlier])
    assert found.verdict == D.FAIL == found.mixed_verdict
    assert found.reasons[0].startswith("attempt 1: mixed batch r3 (alpha)")
    assert D.assess(single, rows, ev, earlier=[rows]).verdict == D.PASS
