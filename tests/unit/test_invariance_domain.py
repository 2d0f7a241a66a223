"""Pure logic of `diag invariance`: comparison (bitwise / atol), fail-closed validation,
the overall verdict, settings read-back, batch evidence, what the engine's records add
to a run (failures, warnings), the text of a divergence, and response parsing."""

from __future__ import annotations

import pytest

from opsctl.collectors.completions import parse_response, token_key
from opsctl.suite.invariance import judge as inv
from opsctl.suite.invariance import judge_engine as eng
from opsctl.suite.invariance.judge import Generated
from tests.standins.completions import ENGINE_INFO


def gen(tokens=(5, 6, 7), lps=(-1.0, -2.0, -0.5), tops=None, **kw) -> Generated:
    if tops is None:
        tops = tuple(
            {t: lp, 100 + i: lp - 1.0} for i, (t, lp) in enumerate(zip(tokens, lps, strict=True))
        )
    return Generated(tuple(tokens), tuple(lps), tuple(tops), "length", **kw)


def cmp(a, b, atol=None, max_tokens=3, logprobs=2):
    return inv.compare(0, a, b, max_tokens=max_tokens, logprobs=logprobs, atol=atol)


def test_bitwise_equal_is_identical():
    r = cmp(gen(), gen())
    assert r.status == inv.IDENTICAL and r.passed
    assert r.first_divergence is None and r.largest_diff == 0.0 and r.tokens_identical


def test_tiny_logprob_difference_fails_bitwise_with_the_first_position():
    b = gen(lps=(-1.0, -2.0 + 4.77e-7, -0.5 + 1e-6))
    r = cmp(gen(), b)
    assert r.status == inv.DIVERGED and not r.passed
    d = r.first_divergence
    assert (d.position, d.kind, d.token_alone, d.token_batched) == (1, "logprob", 6, 6)
    assert d.logprob_alone == -2.0 and d.diff == pytest.approx(4.77e-7)
    assert r.largest_diff == pytest.approx(1e-6) and r.largest_diff_position == 2
    assert r.tokens_identical


def test_atol_allows_the_stated_tolerance():
    b = gen(lps=(-1.0, -2.0 + 4.77e-7, -0.5))
    r = cmp(gen(), b, atol=1e-6)
    assert r.status == inv.WITHIN_ATOL and r.passed and r.largest_diff == pytest.approx(4.77e-7)
    assert cmp(gen(), b, atol=1e-7).status == inv.DIVERGED


def test_token_divergence_stops_the_comparison_there():
    b = gen(tokens=(5, 9, 7))
    r = cmp(gen(), b)
    d = r.first_divergence
    assert (d.position, d.kind, d.token_alone, d.token_batched) == (1, "token", 6, 9)
    assert r.tokens_identical is False and r.compared_positions == 2


def test_top_logprob_values_and_sets_are_compared():
    a = gen()
    tops = list(a.top_logprobs)
    tops[2] = {7: -0.5, 102: -1.5 + 1e-3}
    r = cmp(a, gen(tops=tuple(tops)))
    assert r.first_divergence.position == 2 and r.first_divergence.kind == "top_logprobs"
    tops[2] = {7: -0.5, 999: -1.5}
    r = cmp(a, gen(tops=tuple(tops)))
    assert r.first_divergence.kind == "top_logprobs" and "sets differ" in r.first_divergence.detail


@pytest.mark.parametrize(
    ("batched", "needle"),
    [
        (Generated(error="HTTP 400: boom"), "BS=N: request error: HTTP 400: boom"),
        (Generated(outputs=0), "expected 1 output, got 0"),
        (
            Generated((5, 6, 7), finish_reason="length", has_logprobs=False),
            "no logprobs in the response",
        ),
        (gen(tokens=(5, 6), lps=(-1.0, -2.0)), "fewer tokens than asked: 2 of 3"),
        (
            gen(lps=(-1.0, None, -0.5), tops=({5: -1.0, 1: -2.0},) * 3),
            "missing logprob at position 1",
        ),
        (
            gen(tops=({5: -1.0, 1: -2.0}, {6: -2.0}, {7: -0.5, 1: -1.0})),
            "fewer top logprobs than asked at position 1: 1 of 2",
        ),
        (gen(tops=({5: -1.0, 1: -2.0}, None, {7: -0.5, 1: -1.0})), "at position 1: 0 of 2"),
    ],
)
def test_fail_closed_never_pass_never_skip(batched, needle):
    r = cmp(gen(), batched)
    assert r.status == inv.ERROR and not r.passed and needle in r.reason
    s = inv.summarize([r], None)
    assert s.verdict == "fail" and s.errors == 1 and needle in s.reasons[0]


def test_fail_closed_on_the_bs1_side_too():
    r = cmp(Generated(error="ConnectError: refused"), gen())
    assert r.status == inv.ERROR and r.reason.startswith("BS=1: request error")


def test_summary_verdicts():
    ok = cmp(gen(), gen())
    near = cmp(gen(), gen(lps=(-1.0, -2.0, -0.5 + 1e-7)), atol=1e-6)
    bad = cmp(gen(), gen(lps=(-1.0, -2.0, -0.6)))
    assert inv.summarize([ok, near], 1e-6).verdict == "pass"
    s = inv.summarize([ok, near, bad], 1e-6)
    assert s.verdict == "fail" and (s.identical, s.within_atol, s.diverged) == (1, 1, 1)
    assert s.largest_diff == pytest.approx(0.1) and s.comparison == "atol=1e-06"
    assert inv.summarize([], None).verdict == "fail"
    assert inv.summarize([ok], None, ["BS=8 did not form a batch"]).verdict == "fail"


def test_engine_settings_verified_from_the_engine_records():
    checks = {
        c.name: c
        for c in eng.check_engine_settings(
            ENGINE_INFO, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, mode="eager"
        )
    }
    assert checks["prefix caching"].status == eng.VERIFIED
    assert checks["mm processor cache"].status == eng.NOT_APPLICABLE
    assert checks["VLLM_USE_FLASHINFER_SAMPLER"].status == eng.VERIFIED
    assert checks["execution mode"].status == eng.VERIFIED
    assert "compilation=NONE" in checks["execution mode"].seen


def test_engine_settings_mismatch_and_unknown():
    info = {
        **ENGINE_INFO,
        "enable_prefix_caching": True,
        "mm_processor_cache_gb": 4.0,
        "enforce_eager": False,
        "compilation_mode": "2",
    }
    checks = {
        c.name: c
        for c in eng.check_engine_settings(
            info, {"VLLM_USE_FLASHINFER_SAMPLER": None}, mode="eager"
        )
    }
    assert all(c.failed for c in checks.values()), checks
    assert "DYNAMO_TRACE_ONCE" in checks["execution mode"].seen
    unknown = eng.check_engine_settings(None, None, mode=None)
    assert {c.status for c in unknown} == {eng.NOT_VERIFIED}
    assert "execution mode" not in {c.name for c in unknown}


def test_request_settings_checked_in_the_responses():
    ok = eng.check_request_settings([gen(), gen()], 3)
    assert [c.status for c in ok] == [eng.VERIFIED, eng.VERIFIED]
    not_greedy = gen(tops=({5: -1.0, 1: -0.1}, {6: -2.0, 1: -3.0}, {7: -0.5, 1: -1.0}))
    short = Generated((5,), (-1.0,), ({5: -1.0, 1: -2.0},), "stop")
    checks = eng.check_request_settings([not_greedy, short], 3)
    assert [c.status for c in checks] == [eng.MISMATCH, eng.MISMATCH]


def test_batch_evidence_from_probe_and_metrics():
    steps = [
        {"event": "init"},
        {"event": "step", "req_ids": ["cmpl-t-bs8-p0-x-0-aa", "other"]},
        {"event": "step", "req_ids": [f"cmpl-t-bs8-p{i}-x-0-aa" for i in range(8)]},
    ]
    ev = eng.batch_from_probe(steps, "t-bs8", 8)
    assert (ev.max_batch, ev.steps, ev.formed, ev.source) == (8, 2, True, "batch probe")
    assert eng.batch_from_probe(steps, "nobody", 8) is None
    assert eng.batch_from_metrics([0.0, 1.0, 1.0], 8).formed is False
    assert eng.batch_from_metrics([], 8).formed is None
    # counters: 8 requests x 4 tokens in 4 steps -> all 8 shared steps; in 32 steps -> one
    # request per step is possible, so nothing shown; the sampled gauge can raise the bound
    ev = eng.batch_from_metrics([], 8, steps=4, tokens=32)
    assert (ev.max_batch, ev.formed, ev.tokens) == (8, True, 32)
    assert ev.source.startswith("metrics (generated tokens")
    assert eng.batch_from_metrics([], 8, steps=5, tokens=32).max_batch == 7  # ceil(32/5)
    assert eng.batch_from_metrics([], 8, steps=32, tokens=32).formed is False
    assert eng.batch_from_metrics([3.0], 8, steps=32, tokens=32).max_batch == 3
    assert eng.batch_from_metrics([], 8, steps=0, tokens=0).formed is None


def test_compilation_mode_names():
    assert eng.compilation_mode_name("2") == "DYNAMO_TRACE_ONCE"
    assert eng.compilation_mode_name("CompilationMode.VLLM_COMPILE") == "VLLM_COMPILE"


def test_parse_response_with_token_ids():
    payload = {
        "choices": [
            {
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["token_id:5", "token_id:6"],
                    "token_logprobs": [-1.0, -2.5],
                    "top_logprobs": [
                        {"token_id:5": -1.0, "token_id:9": -3.0},
                        {"token_id:6": -2.5},
                    ],
                },
            }
        ]
    }
    g = parse_response(200, payload)
    assert g.token_ids == (5, 6) and g.logprobs == (-1.0, -2.5)
    assert (
        g.top_logprobs[0] == {5: -1.0, 9: -3.0} and g.finish_reason == "length" and g.error is None
    )


@pytest.mark.parametrize(
    ("status", "payload", "field", "value"),
    [
        (
            400,
            {
                "error": {
                    "message": "Requested sample logprobs of 5, which is greater than max allowed: 0"
                }
            },
            "error",
            "HTTP 400: Requested sample logprobs of 5, which is greater than max allowed: 0",
        ),
        (500, "Internal Server Error", "error", "HTTP 500: Internal Server Error"),
        (200, {"nothing": 1}, "error", "response has no choices list"),
        (200, {"choices": []}, "outputs", 0),
        (200, {"choices": [{"text": "x", "logprobs": None}]}, "has_logprobs", False),
    ],
)
def test_parse_response_fail_closed_values(status, payload, field, value):
    assert getattr(parse_response(status, payload), field) == value


def test_token_key():
    assert token_key("token_id:42") == 42
    assert token_key("hello") == "hello" and token_key("token_id:x") == "token_id:x"


def test_prompt_index_from_engine_request_ids():
    tag = "opsctl-inv-abc-eager-bs1"
    assert eng.prompt_index(f"cmpl-{tag}-p3-1a2b3c4d-0-ffee0011", tag) == 3
    assert eng.prompt_index(f"cmpl-{tag}0-g8-1a2b3c4d-5-ffee0011", tag + "0") == 13
    # a BS=1 tag is not a prefix match of a BS=10 run's ids
    assert eng.prompt_index(f"cmpl-{tag}0-g0-1a2b3c4d-5-ffee0011", tag) is None
    assert eng.prompt_index("cmpl-unrelated-0-aa", tag) is None


def test_prompts_that_ran_alone_in_the_bsn_phase_are_named():
    tag = "t-bs4"
    ids = {i: f"cmpl-{tag}-g0-0123abcd-{i}-ee" for i in range(4)}
    steps = [
        {"event": "step", "req_ids": [ids[0], ids[1], ids[2]]},
        {"event": "step", "req_ids": [ids[3]]},
        {"event": "step", "req_ids": [ids[3], "someone-else"]},
    ]
    ev = eng.batch_from_probe(steps, tag, 4)
    assert ev.alone == (3,) and ev.formed is False and ev.max_batch == 3
    assert ev.per_prompt == {0: 3, 1: 3, 2: 3, 3: 1}
    assert eng.shared_steps(steps, tag) == 3
    assert eng.shared_steps([{"event": "step", "req_ids": [ids[3], "x"]}], tag) == 2


def test_parse_choices_of_a_multi_prompt_request():
    from opsctl.collectors.completions import parse_choices

    def choice(i):
        return {
            "index": i,
            "finish_reason": "length",
            "logprobs": {
                "tokens": ["token_id:1"],
                "token_logprobs": [-0.5],
                "top_logprobs": [{"token_id:1": -0.5}],
            },
        }

    gens = parse_choices(200, {"choices": [choice(2), choice(0)]}, 3)
    assert [g.outputs for g in gens] == [1, 0, 1]
    assert inv.validate(gens[1], 1, 1) == "expected 1 output, got 0"
    errs = parse_choices(400, {"error": {"message": "bad"}}, 2)
    assert [g.error for g in errs] == ["HTTP 400: bad"] * 2


def _settings(status: str = eng.VERIFIED) -> list[eng.SettingCheck]:
    return [eng.SettingCheck("prefix caching", "off", "False", status, "probe")]


def test_run_findings_from_the_batch_probe():
    formed = eng.BatchEvidence("batch probe", 4, 3, 4, (), {i: 4 for i in range(4)})
    assert eng.assess_run(_settings(), formed, batch_size=4, bs1_shared=1) == eng.RunFindings(
        (), ()
    )
    alone = eng.BatchEvidence("batch probe", 3, 3, 4, (3,), {0: 3, 1: 3, 2: 3, 3: 1})
    (failure,) = eng.assess_run(_settings(), alone, batch_size=4, bs1_shared=1).failures
    assert failure.startswith("prompt(s) [3] ran alone in the BS=4 phase")
    single = eng.BatchEvidence("batch probe", 1, 4, 4, ())
    (failure,) = eng.assess_run(_settings(), single, batch_size=4, bs1_shared=1).failures
    assert failure == "BS=4 did not form a batch (batch probe: at most 1 request(s) per step)"
    mismatch = eng.assess_run(_settings(eng.MISMATCH), formed, batch_size=4, bs1_shared=1)
    assert mismatch.failures == ("setting prefix caching: wanted off, engine has False",)


def test_run_findings_that_are_only_warnings():
    counters = eng.batch_from_metrics([], 4, steps=16, tokens=16)
    found = eng.assess_run(
        _settings(eng.NOT_VERIFIED),
        counters,
        batch_size=4,
        bs1_shared=3,
        nudge={"marker": "zebra", "position": 3},
    )
    assert found.failures == ()
    starts = (
        "could not show that BS=4",
        "a BS=1 request shared",
        "TEST NUDGE",
        "could not enforce",
    )
    assert [w.startswith(x) for w, x in zip(found.warnings, starts, strict=True)] == [True] * 4
    assert "16 tokens in 16 steps" in found.warnings[0]
    assert "with 2 other request(s)" in found.warnings[1]
    assert found.warnings[3].endswith(": prefix caching")
    gauge = eng.assess_run(
        _settings(), eng.batch_from_metrics([1.0], 4), batch_size=4, bs1_shared=1
    )
    assert "peak 1" in gauge.warnings[0] and "gauge is sampled" in gauge.warnings[0]
    nothing = eng.assess_run(_settings(), eng.batch_from_metrics([], 4), batch_size=4, bs1_shared=0)
    assert nothing.warnings == (
        "could not show that the batch formed (no batch probe, no metrics)",
    )


def test_platform_and_execution_from_the_records():
    assert eng.platform_of(ENGINE_INFO, None) == "cpu"
    assert eng.platform_of(None, {"platform": "cuda"}) == "cuda"
    assert eng.platform_of(None, None) is None  # null in the report, with a platform_note
    assert eng.platform_of({"platform": "unknown (x)"}, {"platform": "xpu"}) == "xpu"
    assert eng.execution_of(ENGINE_INFO) == {"enforce_eager": True, "compilation_mode": "NONE"}
    assert eng.execution_of(None) is None


def test_divergence_text():
    b = gen(lps=(-1.0, -2.0 + 4.77e-7, -0.5))
    assert (
        inv.divergence_text(cmp(gen(), b))
        == "pos 1 logprob: tok 6/6 lp -2.0/-1.999999523 Δ 4.77e-07"
    )
    assert inv.divergence_text(cmp(gen(), gen())) == "-"
    assert inv.divergence_text(cmp(Generated(error="boom"), gen())) == "BS=1: request error: boom"
    assert inv.fmt_diff(None) == "-" and inv.fmt_diff(0.0) == "0"
    assert inv.preview("a  b\nc") == "a b c" and len(inv.preview("x" * 40)) == 28


def test_domain_invariance_has_no_star_import_leftovers():
    assert not hasattr(inv, "re") and not hasattr(inv, "check_engine_settings")
