"""benchmarks/fidelity_checks.py: its cases are the ones issue 45 item 3 names, each with the
verdict a right check gives, and its usage proxy really inflates what the check judges
(over the scoring stand-in, tests/standins/scoring.py): the same server passes direct and
fails through the proxy, by exactly one token per request. The cases themselves run real
engines: ``python benchmarks/fidelity.py --checks invariance,usage,mm-uuid,lora``."""

from __future__ import annotations

import httpx

from benchmarks import fidelity_checks as fc
from opsctl.checks.target import UrlTarget
from opsctl.suite.usage import run as usage
from tests.standins.scoring import stand_in


def test_every_check_has_its_control_and_its_planted_fault():
    cases = {(c.check, c.expect) for c in fc.CASES}
    for check in ("invariance", "usage", "mm-uuid", "lora"):
        assert {(check, "pass"), (check, "fail")} <= cases, check
    assert len(fc.CASES) == 8


def test_the_proxy_inflates_usage_by_one_token_and_the_check_fails_it():
    with stand_in() as url:
        direct = usage.run(UrlTarget(url), usage.Options())
        with fc.inflating_proxy(url) as proxy:
            inflated = usage.run(UrlTarget(proxy), usage.Options())
            models = httpx.get(f"{proxy}/v1/models").json()  # everything else passes through
    assert direct.verdict == "pass" and inflated.verdict == "fail"
    assert models["data"][0]["id"]
    for a, b in zip(direct.rows, inflated.rows, strict=True):
        assert b["reported_prompt_tokens"] == a["reported_prompt_tokens"] + 1
        assert b["verdict"] == "fail"
