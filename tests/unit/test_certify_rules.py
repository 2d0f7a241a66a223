"""The pure rules of certify's own checks (each folder's judge, opsctl/suite/): liveness,
patch-ledger sanity, Engram hygiene, shutdown hygiene; and the selection for a hybrid
KV cache model."""

from __future__ import annotations

import pytest

from opsctl.checks.findings_report import verdict_of
from opsctl.domain import certify as dom
from opsctl.suite.engram import judge_hygiene as engram_rules
from opsctl.suite.liveness import judge as liveness_rules
from opsctl.suite.patches import judge as patches_rules
from opsctl.suite.shutdown import judge as shutdown_rules


def live(**kw) -> liveness_rules.Liveness:
    base = dict(
        health_status=200, health_error=None, endpoint="/v1/completions", request_status=200,
        request_error=None, tokens=4, counter=liveness_rules.GEN_COUNTER, before=10.0, after=14.0,
        waited=0.2,
    )  # fmt: skip
    return liveness_rules.Liveness(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "codes", "verdict"),
    [
        ({}, ["liveness.progress"], "pass"),
        ({"after": 10.0}, ["liveness.no_progress"], "fail"),
        ({"health_status": 503}, ["liveness.health", "liveness.progress"], "fail"),
        (
            {"request_status": None, "request_error": "no answer within 5 s", "after": 10.0},
            ["liveness.request"],
            "fail",
        ),
        ({"before": None, "after": None}, ["liveness.unverified"], "unverified"),
    ],
)
def test_liveness(kw, codes, verdict):
    found = liveness_rules.liveness_findings(live(**kw))
    assert [f.code for f in found] == codes
    assert verdict_of(found) == verdict


def test_a_stuck_engine_is_named_as_such():
    (f,) = liveness_rules.liveness_findings(live(after=10.0, waited=15.0))
    assert "did not advance within 15 s" in f.message and "no forward progress" in f.message


RECORD = {
    "pid": 7,
    "role": "engine_core",
    "vllm_version": "0.32.0",
    "platform": "cpu",
    "patches": [{"name": "a", "status": "applied"}, {"name": "b", "status": "skipped"}],
    "test_knobs": {},
}


def test_ledger_sane_failed_and_knobs():
    assert [f.code for f in patches_rules.ledger_findings([RECORD])] == ["patches.sane"]
    broken = {**RECORD, "patches": [{"name": "b", "status": "failed", "detail": "boom\ntrace"}]}
    (f,) = patches_rules.ledger_findings([RECORD, broken])
    assert f.code == "patches.failed" and f.message.endswith(": boom")
    knobbed = {**RECORD, "test_knobs": {"OPSCTL_PROBE_NUDGE": "fox:3"}}
    (f,) = patches_rules.ledger_findings([knobbed])
    assert f.code == "patches.test_knobs" and "OPSCTL_PROBE_NUDGE=fox:3" in f.message
    assert patches_rules.ledger_findings([])[0].code == "patches.no_ledger"
    summary = patches_rules.ledger_summary(
        [{**RECORD, "role": "api_server", "platform": None}, broken]
    )
    assert summary["platform"] == "cpu" and summary["failed"] == ["b"]
    assert summary["patches"] == {"a": {"applied": 1}, "b": {"skipped": 1, "failed": 1}}


def test_engram_hygiene():
    found = engram_rules.engram_findings([], [], None)
    assert [f.code for f in found] == ["engram.no_orphans", "engram.not_in_model"]
    # the key names of engram clean's and engram plan's documents (opsctl.engram.*/2)
    orphans = [{"name": "vllm_engram_x", "size_bytes": 64}]
    capacity = {"total_bytes": 10, "shm_free_bytes": 5, "fits_shm": False, "chosen": "dp-sharded"}
    inspect = [{"severity": "fail", "code": "engram.fill_mismatch", "message": "m"}]
    found = engram_rules.engram_findings(inspect, orphans, capacity)
    assert [f.code for f in found] == [
        "engram.fill_mismatch",
        "engram.orphans",
        "engram.shm_capacity",
    ]
    assert verdict_of(found) == "fail"
    assert "falls back to dp-sharded" in found[-1].message
    assert "(5 bytes free)" in found[-1].message and "(64 bytes)" in found[1].message


def shut(**kw) -> shutdown_rules.Shutdown:
    base = dict(
        index=0, url="http://x", stopped=True, seconds=0.5, signals=("SIGTERM api-server",),
        leftover_pids=(), alive_now=(), shm_removed=("psm_1",), shm_kept=(), shm_left_now=(),
    )  # fmt: skip
    return shutdown_rules.Shutdown(**{**base, **kw})


def test_shutdown_hygiene():
    assert [f.code for f in shutdown_rules.shutdown_findings([shut()])] == ["shutdown.clean"]
    found = shutdown_rules.shutdown_findings([shut(alive_now=(42,), shm_left_now=("psm_2",))])
    assert [f.code for f in found] == ["shutdown.processes", "shutdown.segments"]
    assert found[0].details == {"pids": [42]}
    assert shutdown_rules.shutdown_findings([shut(stopped=False)])[0].code == "shutdown.not_stopped"
    assert shutdown_rules.shutdown_findings([])[0].code == "shutdown.no_engine"


def test_hybrid_model_selection_and_kind():
    s = dom.Subject(
        managed=True, model="tiny-hybrid", archetype="hybrid-decoder", kv_groups=2, run_dir=True
    )
    assert dom.select(s).run == (
        "liveness",
        "patches",
        "engram",
        "invariance",
        "kv-fail",
        "shutdown",
    )
    assert s.kind()["hybrid_kv"] and s.kind()["generative"]
    pooled = dom.Subject(managed=False, model="m", archetype="pooling", run_dir=False)
    assert dom.select(pooled).run == ("liveness", "engram", "usage")


def test_a_server_whose_prefix_caching_is_on_is_not_judged_for_invariance_by_default():
    served = dom.Subject(
        managed=False, model="tiny-llama", archetype="decoder", run_dir=True, prefix_caching=True
    )
    chosen = dom.select(served)
    assert "invariance" not in chosen.run
    why = chosen.skipped["invariance"]
    assert "prefix caching on" in why and "opsctl certify --checks invariance URL" in why
    assert "opsctl diag invariance --model tiny-llama" in why
    # asked for by name it runs (and judges fail-closed)
    assert dom.select(served, only=("invariance",)).run == ("invariance",)
    # off, or not known, or an engine opsctl starts: judged as before
    for s in (
        dom.Subject(managed=False, model="m", archetype="decoder", prefix_caching=False),
        dom.Subject(managed=False, model="m", archetype="decoder", prefix_caching=None),
        dom.Subject(managed=True, model="m", archetype="decoder", prefix_caching=True),
    ):
        assert "invariance" in dom.select(s).run, s
