"""The calibration rule of opsctl.suite.invariance.judge_calibration (pure): floor, sensitivity,
bound, the MARGIN rule, the sweep's verdict and the seeded prompt sets; and
``diag invariance`` over stand-in servers whose run-to-run noise is known (``jitter``):
bitwise where the floor is 0, within the floor when the effect stands clearly above it,
``inconclusive`` (exit 1, saying what would make it conclusive) when it does not, and a
planted difference beyond the floor still fails. Real engines: test_invariance_e2e.py."""

from __future__ import annotations

import math

import pytest

from opsctl.checks.target import UrlTarget
from opsctl.errors import CheckFailed
from opsctl.suite.invariance import judge_calibration as cal
from opsctl.suite.invariance import run as check
from opsctl.suite.invariance.judge import Generated
from tests.standins.completions import Behaviour, completions_server


def gen(tokens, lps, tops=None) -> Generated:
    return Generated(tuple(tokens), tuple(lps), tuple(tops or [None] * len(tokens)))


def test_run_diff_is_bitwise_zero_inf_on_a_token_and_the_largest_logprob_otherwise():
    a = gen([1, 2, 3], [-0.5, -1.0, -2.0], [{1: -0.5, 9: -3.0}, None, None])
    assert cal.run_diff(a, a, 3) == 0.0
    b = gen([1, 2, 3], [-0.5, -1.25, -2.0], [{1: -0.5, 9: -3.5}, None, None])
    assert cal.run_diff(a, b, 3) == 0.5  # the top-k entry of token 9 moved most
    assert math.isinf(cal.run_diff(a, gen([1, 2, 4], [-0.5, -1.0, -2.0]), 3))
    assert math.isinf(cal.run_diff(a, gen([1, 2], [-0.5, -1.0]), 3))  # too short: not judged
    assert math.isinf(cal.run_diff(a, Generated(error="HTTP 500"), 3))


def test_first_position_effect_reads_position_zero_only():
    a = gen([1, 2], [-0.5, -1.0], [{1: -0.5, 7: -2.0}, None])
    b = gen([4, 2], [-0.75, -9.0], [{4: -0.75, 7: -1.0}, None])
    assert cal.first_position_effect(a, b) == 1.0  # token 7 in both top lists: 1.0 apart
    assert cal.first_position_effect(a, Generated(error="x")) is None


def test_the_rule_bitwise_floor_zero_is_conclusive_and_stays_bitwise():
    c = cal.Calibration(floor=0.0, sensitivity=0.3)
    assert c.bitwise and c.conclusive and c.atol_for_compare() is None
    assert c.judge(True) == "pass" and c.judge(False) == "fail"
    assert c.to_dict()["ratio"] is None and c.to_dict()["bitwise"] is True  # inf: no number


def test_the_rule_needs_the_effect_more_than_margin_times_the_bound():
    clear = cal.Calibration(floor=0.03, sensitivity=2.18)  # kv-fail hybrid on an H100: 73x
    assert clear.conclusive and clear.atol_for_compare() == 0.06 and clear.judge(True) == "pass"
    close = cal.Calibration(floor=0.03, sensitivity=0.5)  # 8.3x the bound (0.06): hidden
    assert not close.conclusive and close.judge(True) == close.judge(False) == "inconclusive"
    assert "float32" in close.why_inconclusive() and "0.5" in close.why_inconclusive()
    atol = cal.Calibration(floor=0.0, sensitivity=0.05, atol=0.01)  # the operator's tolerance
    assert atol.bound == 0.01 and not atol.conclusive  # 5x: an atol that hides the effect
    tokens = cal.Calibration(floor=math.inf, sensitivity=3.0)
    assert not tokens.conclusive and "differ in a token" in tokens.why_inconclusive()
    assert not cal.Calibration(floor=0.0, sensitivity=None).conclusive


def test_calibrate_takes_the_largest_floor_and_the_smallest_effect():
    a = gen([1], [-0.5])
    c = cal.calibrate([(a, a), (a, gen([1], [-0.5001]))], [0.4, None, 0.2], 1)
    assert c.floor == pytest.approx(1e-4) and c.sensitivity == 0.2
    assert (c.floor_runs, c.probes) == (2, 2)
    assert cal.calibrate([(a, a)], [0.0, None], 1).sensitivity is None  # nothing planted


def test_sweep_verdict_and_totals():
    assert cal.sweep_verdict(["pass", "pass"]) == "pass"
    assert cal.sweep_verdict(["pass", "inconclusive"]) == "inconclusive"
    assert cal.sweep_verdict(["inconclusive", "fail", "pass"]) == "fail"
    assert cal.sweep_verdict([]) == "fail"  # nothing judged is never a pass
    assert cal.sweep_verdict(["pass", "unverified"]) == "unverified"
    assert cal.sweep_totals(["pass", "fail", "unverified"]) == {
        "pass": 1,
        "fail": 1,
        "inconclusive": 1,
    }


def test_seeded_prompts_are_deterministic_distinct_and_differ_between_seeds():
    assert cal.seeded_prompts(3, 8) == cal.seeded_prompts(3, 8)
    assert len(set(cal.seeded_prompts(3, 8))) == 8
    assert cal.seeded_prompts(3, 8) != cal.seeded_prompts(4, 8)


PROMPTS = ("alpha beta", "a zebra crossing", "gamma delta")


def options(**kw) -> check.Options:
    return check.Options(**{"prompts": PROMPTS, "max_tokens": 4, "logprobs": 2, **kw})


def test_bitwise_engine_shows_floor_zero_and_passes(home):
    with completions_server(Behaviour()) as (url, _):
        report = check.run(UrlTarget(url), options())
    run = report.runs[0]
    assert report.verdict == "pass" and run["calibration"]["floor"] == 0.0
    assert run["calibration"]["bitwise"] and run["summary"]["comparison"] == "bitwise"
    assert run["calibration"]["sensitivity"] > 0 and run["calibration"]["probes"] == 2


def test_noise_well_below_the_effect_passes_within_the_floor(home):
    with completions_server(Behaviour(jitter=1e-3)) as (url, _):
        report = check.run(UrlTarget(url), options())
    c = report.runs[0]["calibration"]
    assert report.verdict == "pass", report.reasons
    assert 0 < c["floor"] <= 1e-3 and c["conclusive"] and c["ratio"] > cal.MARGIN
    assert report.runs[0]["summary"]["comparison"].startswith("floor=")


def test_a_planted_difference_beyond_the_floor_still_fails(home):
    with completions_server(Behaviour(jitter=1e-3, diverge=("zebra", 2, 0.05))) as (url, _):
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "fail" and report.runs[0]["calibration"]["conclusive"]
    assert report.runs[0]["prompts"][1]["status"] == "diverged"


def test_noise_as_large_as_the_effect_is_inconclusive_never_a_pass(home):
    with completions_server(Behaviour(jitter=0.1)) as (url, _):
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "inconclusive" and not report.passed
    assert not report.runs[0]["calibration"]["conclusive"]
    assert any("to make it conclusive" in r for r in report.reasons)
    failure = check.outcome(report, options()).failure
    assert isinstance(failure, CheckFailed) and "inconclusive" in failure.message


def test_a_sweep_runs_one_prompt_set_per_seed_and_totals_them(home):
    with completions_server(Behaviour()) as (url, b):
        report = check.run(UrlTarget(url), check.Options(max_tokens=4, seeds=(1, 3, 5)))
        sent = {p for body in b.bodies for p in (body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]])}  # fmt: skip
    doc = report.to_dict()
    assert doc["seeds"] == [1, 3, 5] and [r["seed"] for r in doc["runs"]] == [1, 3, 5]
    assert doc["totals"] == {"pass": 3, "fail": 0, "inconclusive": 0}
    assert [s["seed"] for s in doc["sweep"]] == [1, 3, 5]
    for seed in (1, 3, 5):  # each seed's own prompts were sent
        assert set(cal.seeded_prompts(seed, 8)) <= sent
