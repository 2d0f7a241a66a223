"""Pure logic of diag kv-fail and the connector's injection plan."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine_patches.connectors.injection import (
    NULL_BLOCK_ID,
    BlockSel,
    InjectionPlan,
    SpecError,
    parse_blocks_spec,
    prefix_key,
    prefix_len,
    unit_draw,
)
from opsctl.suite.kv_fail import judge as dom
from opsctl.suite.kv_fail import judge_report as kvr

# ---- injection plan ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("-1", (BlockSel(None, -1),)),
        ("1:0", (BlockSel(1, 0),)),
        ("0:*,*:2", (BlockSel(0, None), BlockSel(None, 2))),
    ],
)
def test_parse_blocks_spec(spec, want):
    assert parse_blocks_spec(spec) == want


@pytest.mark.parametrize("spec", ["", "a", "1:", "-1:0", "1,,2", "x:1"])
def test_parse_blocks_spec_rejects(spec):
    with pytest.raises(SpecError):
        parse_blocks_spec(spec)


def test_select_positions_groups_and_null_block():
    ids = ([NULL_BLOCK_ID, 11, 12], [21, 22, 23])  # group 0: position 0 slid out of the window
    ranges = [(0, 3), (0, 3)]
    assert InjectionPlan(blocks="-1").select("k", "r", ids, ranges) == [(0, 2, 12), (1, 2, 23)]
    assert InjectionPlan(blocks="0").select("k", "r", ids, ranges) == [(1, 0, 21)]  # null skipped
    assert InjectionPlan(blocks="1:*").select("k", "r", ids, ranges) == [
        (1, 0, 21),
        (1, 1, 22),
        (1, 2, 23),
    ]
    # only loaded positions count: a load of positions 1..2
    assert InjectionPlan(blocks="0").select("k", "r", ids, [(1, 3), (1, 3)]) == []


def test_select_targets_requests():
    ids = ([5, 6],)
    plan = InjectionPlan(requests=("keyA",))  # requests alone -> default spec -1
    assert plan.select("keyA", "cmpl-1", ids, [(0, 2)]) == [(0, 1, 6)]
    assert plan.select("keyB", "cmpl-2", ids, [(0, 2)]) == []
    assert InjectionPlan(blocks="0", requests=("cmpl-2",)).select(
        "keyB", "cmpl-2-0", ids, [(0, 2)]
    ) == [(0, 0, 5)]


def test_rate_is_seeded_and_order_free():
    ids = (list(range(100, 164)),)
    a = InjectionPlan(rate=0.25, seed=4).select("k", "r", ids, [(0, 64)])
    b = InjectionPlan(rate=0.25, seed=4).select("k", "other-id", ids, [(0, 64)])
    c = InjectionPlan(rate=0.25, seed=5).select("k", "r", ids, [(0, 64)])
    assert a == b and a != c
    assert 4 < len(a) < 30
    assert InjectionPlan(rate=0.0).select("k", "r", ids, [(0, 64)]) == []
    assert len(InjectionPlan(rate=1.0).select("k", "r", ids, [(0, 64)])) == 64
    assert 0 <= unit_draw(1, "k", 0, 0) < 1


def test_plan_validation_and_json_round_trip():
    with pytest.raises(SpecError):
        InjectionPlan(rate=1.5)
    plan = InjectionPlan(blocks="1:-1", seed=3, requests=("a", "b"), epoch="inject", silent=True)
    again = InjectionPlan.from_json(plan.to_json())
    assert again == plan and again.select("a", "", ([1, 2],), [(0, 2)]) == []
    assert again.select("a", "", ([1, 2], [3, 4]), [(0, 2), (0, 2)]) == [(1, 1, 4)]
    assert not InjectionPlan.from_json({"enabled": False, "blocks": "-1"}).active


def test_prefix_len_and_key():
    assert prefix_len(70, 32) == 64 and prefix_len(65, 32) == 64 and prefix_len(64, 32) == 32
    assert prefix_len(1, 32) == 0
    assert prefix_key([1, 2, 3]) == prefix_key((1, 2, 3)) != prefix_key([1, 2, 4])


# ---- settings, model check, workload ------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"rate": 1.5}, "outside 0..1"),
        ({"rate": -0.1}, "outside 0..1"),
        ({"rate": 0.1, "blocks": "-1"}, "either --rate or --blocks"),
        ({"policy": "retry"}, "unknown policy"),
        ({"requests": 0}, "--requests"),
        ({"targets": 9}, "--fail-requests"),
        ({"blocks": "1:x"}, "blocks spec"),
    ],
)
def test_settings_validate(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        dom.Settings(**kwargs).validate()


def test_settings_plan():
    s = dom.Settings(rate=0.5, seed=2)
    s.validate()
    assert s.mode == "rate" and s.plan(("k",)).rate == 0.5
    p = dom.Settings().plan(("k",), "sensitivity", silent=True)
    assert p.blocks == "-1" and p.silent and p.epoch == "sensitivity"


@pytest.mark.parametrize(
    ("config", "ok"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, True),
        (
            {
                "architectures": ["LlamaForCausalLM"],
                "layer_types": ["sliding_attention", "full_attention"],
            },
            True,
        ),
        (
            {
                "architectures": ["GraniteMoeHybridForCausalLM"],
                "layer_types": ["mamba", "attention"],
            },
            False,
        ),
        (
            {
                "architectures": ["FooForCausalLM"],
                "layer_types": ["linear_attention", "full_attention"],
            },
            False,
        ),
        ({"architectures": ["BertModel"]}, False),
        ({"architectures": ["Blip2ForConditionalGeneration"]}, False),
        ({}, False),
    ],
)
def test_servable(config, ok):
    assert (dom.servable(config) is None) is ok


def test_prompts_are_reproducible_distinct_and_block_aligned():
    a = dom.make_prompts(6, 1, 320)
    assert a == dom.make_prompts(6, 1, 320) and a != dom.make_prompts(6, 2, 320)
    assert len(set(dom.keys_of(a))) == 6
    for p in a:
        assert 2 * 32 < len(p) <= 160 and len(p) % 32 >= 2
        assert all(4 <= t < 320 for t in p)
    assert (
        dom.choose_targets(4, 0, None) == dom.choose_targets(4, 0, 2)
        and len(dom.choose_targets(5, 0, None)) == 3
    )


# ---- outputs and accounting ---------------------------------------------------------
def _completion(ids, lps, reason="length"):
    return {
        "choices": [
            {
                "finish_reason": reason,
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps},
            }
        ]
    }


def test_outputs_and_compare():
    base = dom.output_from_response(200, _completion([5, 6, 7], [-0.1, -0.2, -0.3]))
    same = dom.output_from_response(200, _completion([5, 6, 7], [-0.1, -0.2, -0.3]))
    drift = dom.output_from_response(200, _completion([5, 6, 7], [-0.1, -0.2, -0.30001]))
    other = dom.output_from_response(200, _completion([5, 9, 7], [-0.1, -0.2, -0.3]))
    err = dom.output_from_response(200, _completion([], [], "error"))
    http = dom.output_from_response(500, {"error": {"message": "EngineDeadError"}})
    assert base.token_ids == (5, 6, 7) and dom.compare(base, same).identical
    c = dom.compare(base, drift)
    assert (
        c.tokens_equal
        and not c.logprobs_equal
        and c.max_logprob_diff == pytest.approx(1e-5, rel=1e-2)
    )
    assert dom.compare(base, other).first_divergence == 1
    assert err.failed and http.failed and "EngineDeadError" in http.error
    assert not dom.compare(base, http).identical


def test_account_reads_vllm_lines():
    log = "\n".join(
        [
            "(EngineCore pid=1) WARNING [scheduler.py:3427] Recovered from KV load failure: "
            "1 request(s) rescheduled (64 tokens affected).",
            "noise",
            "(EngineCore pid=1) WARNING [kv_hybrid_recompute.py:218] Recovered from KV load failure: "
            "2 request(s) rescheduled (96 tokens affected).",
            "(EngineCore pid=1) ERROR Failing 1 request(s) due to KV load failure "
            "(failure_policy=fail, 32 tokens affected). Request IDs: {'x'}",
        ]
    )
    a = dom.account(log)
    assert (a.rescheduled_requests, a.recomputed_tokens, a.failed_requests, a.failed_tokens) == (
        3,
        160,
        1,
        32,
    )
    assert len(a.lines) == 3
    dead = "RuntimeError: A KV connector reported ... not supported for models with multiple KV cache groups."
    assert dom.death_lines("x\n" + dead) == [dead]


def _rows(n=4, targeted=(0, 1)):
    return tuple(kvr.RequestRow(i, 100, i in targeted) for i in range(n))


def _facts(policy="recompute", rows=None, **kw):
    return kvr.Facts(dom.Settings(policy=policy), _rows() if rows is None else rows, **kw)


def _ok(out=True):
    return dom.Comparison(out, out, 0.0 if out else 1.0, None if out else 0)


def _codes(f):
    return {x["code"] for x in kvr.summary(f)["findings"]}


def test_judge_pass_and_failures():
    done = dom.Output(True, "length", (1,), (0.0,))
    rows = tuple(
        replace(
            r, roundtrip=_ok(), inject_output=done, inject=_ok(), injected_blocks=int(r.targeted)
        )
        for r in _rows()
    )
    good = _facts(rows=rows, injections=2, roundtrip_loads=4)
    assert kvr.summary(good)["verdict"] == "pass"

    differs = (*rows[:2], replace(rows[2], inject=_ok(False)), rows[3])  # a survivor differs
    s = kvr.summary(replace(good, rows=differs))
    assert s["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes(
        replace(good, rows=differs)
    )

    dead = _facts(died_in="inject", death=("RuntimeError: boom",), engine_alive=False)
    s = kvr.summary(dead)
    assert s["verdict"] == "fail" and not s["engine_alive"]
    (died,) = [f for f in s["findings"] if f["code"] == "kv_fail.engine_died"]
    assert "boom" in died["message"] and "patch prevents" not in died["message"]
    unpatched = kvr.summary(replace(dead, patch_disabled=True))["findings"]
    assert any("kv_hybrid_recompute patch prevents" in f["message"] for f in unpatched)

    def failing_row(r):
        reason = "error" if r.index in (0, 2) else "length"
        out = dom.Output(True, reason, (1,), (0.0,))
        return replace(
            r,
            roundtrip=_ok(),
            injected_blocks=int(r.targeted),
            inject_output=out,
            inject=None if out.failed else _ok(),
        )

    failing = _facts(
        "fail", tuple(failing_row(r) for r in _rows()), injections=2, roundtrip_loads=4
    )
    codes = _codes(failing)
    assert "kv_fail.innocent_failed" in codes  # request 2 failed without injection
    assert "kv_fail.injected_not_failed" in codes  # request 1 was hit but did not fail

    unloaded = _facts(rows=tuple(replace(r, roundtrip=_ok()) for r in _rows()), roundtrip_loads=1)
    assert "kv_fail.roundtrip_not_loaded" in _codes(unloaded)
    assert "kv_fail.nothing_injected" in _codes(unloaded)


# ---- rows from phase outputs, engine records, the report's shape ----------------------
def test_request_rows_compare_only_finished_phases():
    prompts = ((1, 2), (3, 4))
    a = dom.Output(True, "length", (5,), (-0.5,))
    b = dom.Output(True, "length", (6,), (-0.5,))
    failed = dom.Output(True, "error")
    outputs = {"store": [a, a], "roundtrip": [a, b], "inject": [failed, a]}
    rows = kvr.request_rows(prompts, (0,), outputs, {"roundtrip"}, {0: 2})
    assert [r.roundtrip.identical for r in rows] == [True, False]
    assert rows[0].targeted and not rows[1].targeted and rows[0].injected_blocks == 2
    assert rows[0].failed and rows[0].inject is None  # failed: never compared
    assert rows[1].inject is None  # inject not finished alive: its outcome shows, no comparison
    rows = kvr.request_rows(prompts, (0,), outputs, {"roundtrip", "inject"}, {})
    assert rows[0].inject is None and rows[1].inject.identical
    partial = kvr.request_rows(prompts, (), {"store": [a, a], "inject": [a]}, {"inject"}, {})
    assert partial[0].inject.identical and partial[1].inject_output is None


def test_event_records_and_what_they_count():
    inj = [
        dom.Injection.from_event({"key": "k1", "group": 0, "epoch": "inject"}),
        dom.Injection.from_event({"key": "k1", "group": 1, "epoch": "inject"}),
        dom.Injection.from_event({"key": "k2", "epoch": "sensitivity", "reported": False}),
        dom.Injection.from_event({"key": "k3", "epoch": "inject", "reported": False}),
    ]
    assert dom.injected_blocks(inj, ["k0", "k1", "k2", "k3"]) == {1: 2, 3: 1}
    assert dom.affected_requests(inj) == 1  # k3 was not reported
    transfers = [
        dom.Transfer.from_event({"op": "load", "key": "a", "blocks": 3, "epoch": "roundtrip"}),
        dom.Transfer.from_event({"op": "load", "key": "a", "blocks": 3, "epoch": "roundtrip"}),
        dom.Transfer.from_event({"op": "load", "key": "b", "blocks": 0, "epoch": "roundtrip"}),
        dom.Transfer.from_event({"op": "store", "key": "c", "blocks": 3, "epoch": "roundtrip"}),
        dom.Transfer.from_event({"op": "load", "key": "d", "blocks": 3, "epoch": "inject"}),
    ]
    assert dom.roundtrip_loads(transfers) == 1
    rec = [
        dom.Recovery.from_event({"action": "recomputed", "tokens": 64}),
        dom.Recovery.from_event({"action": "recomputed", "tokens": 32}),
        dom.Recovery.from_event({"action": "failed", "tokens": 99}),
    ]
    assert dom.recomputed_by_patch(rec) == 96


def test_ranks_count_once_and_must_agree():
    """TP=2: each worker records the blocks it failed; one rank's count the injections,
    and a rank that failed other blocks is a failed finding."""

    def ev(rank, key="k1", pos=3, epoch="inject"):
        e = {"key": key, "group": 1, "position": pos, "epoch": epoch, "rank": rank}
        return dom.Injection.from_event(e)

    same = [ev(0), ev(1), ev(0, "k2"), ev(1, "k2")]
    assert dom.lead(same) == [ev(0), ev(0, "k2")]
    assert dom.injected_blocks(dom.lead(same), ["k1", "k2"]) == {0: 1, 1: 1}
    assert dom.rank_disagreement(same) is None
    assert dom.rank_disagreement([ev(0)]) is None  # one rank: nothing to compare
    assert dom.Injection.from_event({"key": "k"}).rank == 0  # events of one rank name none
    odd = [ev(0), ev(1, pos=2)]
    assert dom.rank_disagreement(odd) == "rank(s) [1] injected other blocks than rank 0 " \
        "(rank 0: 1, rank 1: 1)"  # fmt: skip
    done = dom.Output(True, "length", (1,), (0.0,))
    rows = tuple(
        replace(r, roundtrip=_ok(), inject_output=done, inject=_ok(), injected_blocks=int(r.targeted))
        for r in _rows()
    )  # fmt: skip
    agree = _facts(rows=rows, injections=2, roundtrip_loads=4, ranks=2)
    assert kvr.summary(agree)["verdict"] == "pass" and "kv_fail.ranks_agree" in _codes(agree)
    disagree = replace(agree, rank_disagreement=dom.rank_disagreement(odd))
    assert kvr.summary(disagree)["verdict"] == "fail"
    assert "kv_fail.ranks_disagree" in _codes(disagree)
    assert "kv_fail.ranks_agree" not in _codes(_facts(rows=rows, injections=2, roundtrip_loads=4))


def test_recovery_logged_waits_for_every_affected_request():
    one = "Recovered from KV load failure: 1 request(s) rescheduled (32 tokens affected)."
    failing = (
        "Failing 1 request(s) due to KV load failure (failure_policy=fail, 32 tokens affected)"
    )
    assert dom.recovery_logged("", 0)
    assert not dom.recovery_logged(one, 2)
    assert dom.recovery_logged(f"{one}\nnoise\n{one}", 2)
    assert dom.recovery_logged(f"{failing}\n{one}", 2)


def test_engine_facts_from_engine_core_record():
    records = [
        {"role": "api_server", "vllm_version": "x", "patches": []},
        {
            "role": "engine_core",
            "vllm_version": "0.32.0",
            "platform": "cpu",
            "patches": [
                {"name": "kv_hybrid_recompute", "status": "skipped", "detail": "off\nmore"}
            ],
        },
    ]
    e = kvr.engine_facts({"kv_load_failure_policy": "fail", "kv_cache_groups": [{}]}, records)
    assert (e.vllm_version, e.platform, e.policy, e.kv_cache_groups) == (
        "0.32.0",
        "cpu",
        "fail",
        [{}],
    )
    assert e.patch == {"name": "kv_hybrid_recompute", "status": "skipped", "detail": "off"}
    assert kvr.engine_facts({}, []).patch["status"] is None


def test_report_fields_keep_the_schema_2_shape():
    s = dom.Settings(rate=0.5, seed=3)
    work = dom.workload(s, 320)
    out = dom.Output(True, "length", (5,), (-0.5,))
    fields = kvr.report_fields(
        kvr.Facts(s, _rows()),
        model="tiny-llama",
        engine=kvr.engine_facts({"platform": "cpu"}, []),
        targets=work.targets,
        recoveries=(),
        metrics={"vllm:num_preemptions_total": 0.0},
        phase_seconds={"store": 1.0},
        baseline=[out],
        prompts=work.prompts,
        run_dir="/r",
    )
    assert list(fields) == [
        "vllm_version",
        "platform",
        "platform_note",
        "model",
        "kv_cache_groups",
        "kv_load_failure_policy",
        "patch",
        "recovery_patches",
        "injection",
        "failures_injected",
        "requests_affected",
        "tokens_recomputed",
        "tokens_recomputed_source",
        "requests_rescheduled",
        "requests_failed",
        "engine_alive",
        "outputs_identical",
        "noise_floor",
        "findings",
        "verdict",
        "tokens_recomputed_by_patch",
        "engine_death",
        "died_in_phase",
        "metrics_delta",
        "phase_durations_s",
        "requests",
        "baseline",
        "prompts",
        "run_dir",
    ]
    assert fields["injection"] == {
        "route": "blocks",
        "mode": "rate",
        "rate": 0.5,
        "blocks": None,
        "seed": 3,
        "targets": [0, 1, 2, 3],  # a rate without --fail-requests hits every request
    }
    assert (fields["platform"], fields["platform_note"]) == ("cpu", None)
    assert fields["phase_durations_s"] == {"store": 1.0}
    assert fields["kv_load_failure_policy"] == "recompute"  # the engine said nothing
    assert fields["engine_death"] is None and fields["prompts"][0] == list(work.prompts[0])
    json.dumps(fields)  # plain JSON


# ---- noise floor and vLLM's recovery defects (synthesized corners; the recorded GPU
# ---- runs are replayed in test_gpu_recordings.py) -------------------------------------
def _c(diff, tokens=True, first=None):
    return dom.Comparison(tokens, diff == 0.0 and tokens, diff, first)


def _noisy_facts(roundtrip, recovered, *, sens=1.4, quiet=None, engine=None):
    """Requests 0 and 3 targeted (one injected block each), 1 and 2 not."""
    done = dom.Output(True, "length", (1,), (0.0,))
    quiet = roundtrip if quiet is None else quiet
    rows = tuple(
        kvr.RequestRow(
            i,
            100,
            i in (0, 3),
            int(i in (0, 3)),
            roundtrip,
            recovered if i in (0, 3) else quiet,
            done,
            _c(sens, False, 0) if i in (0, 3) else quiet,
        )
        for i in range(4)
    )
    return kvr.Facts(
        dom.Settings(),
        rows,
        roundtrip_loads=4,
        injections=2,
        accounting=dom.Accounting(2, 64),
        sensitivity_ran=True,
        engine=engine or kvr.EngineFacts("0.32.0", "cpu"),
    )


def test_a_zero_floor_compares_bitwise():
    """CPU (floor 0): a recovered request 1e-7 off with equal tokens fails as before."""
    s = kvr.summary(_noisy_facts(_c(0.0), _c(1e-7)))
    assert s["noise_floor"] == {
        "max_logprob_diff": 0.0,
        "mode": "bitwise",
        "tolerance": 0.0,
        "roundtrip_tokens_equal": True,
        "min_sensitivity_max_logprob_diff": 1.4,
        "separation": None,
        "separation_needed": kvr.SEPARATION,
    }
    assert s["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes_of(s)
    assert kvr.summary(_noisy_facts(_c(0.0), _c(0.0)))["verdict"] == "pass"


def _codes_of(summary):
    return {f["code"] for f in summary["findings"]}


def test_a_trusted_floor_allows_twice_the_floor_with_equal_tokens():
    floor = 4e-5
    ok = kvr.summary(_noisy_facts(_c(floor), _c(2 * floor)))
    assert ok["verdict"] == "pass" and ok["noise_floor"]["mode"] == "noise_floor"
    assert "kv_fail.outputs_within_noise" in _codes_of(ok)
    over = kvr.summary(_noisy_facts(_c(floor), _c(2.5 * floor)))
    assert over["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes_of(over)
    tokens = kvr.summary(_noisy_facts(_c(floor), _c(floor, tokens=False, first=5)))
    assert tokens["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes_of(tokens)
    # the untargeted requests count into the floor too
    quiet = kvr.summary(_noisy_facts(_c(1e-5), _c(1.5e-4), quiet=_c(8e-5)))
    assert quiet["noise_floor"]["max_logprob_diff"] == 8e-5 and quiet["verdict"] == "pass"


def test_a_noisy_round_trip_with_changed_tokens_is_inconclusive():
    s = kvr.summary(_noisy_facts(_c(3e-2, tokens=False, first=7), _c(1e-5)))
    assert s["verdict"] == "inconclusive"
    assert s["noise_floor"]["mode"] == "inconclusive"
    assert s["noise_floor"]["roundtrip_tokens_equal"] is False
    (f,) = [x for x in s["findings"] if x["code"] == "kv_fail.comparison_inconclusive"]
    assert "changed generated tokens" in f["message"]
    assert f["severity"] == "warning" and f["details"]["hint"] == kvr.CONCLUSIVE_HINT
    assert (
        "float32" in f["message"]
        and "--mode eager" in f["message"]
        and "--max-tokens" in f["message"]
    )
    # nothing is judged on top of a comparison that cannot be trusted
    assert not _codes_of(s) & {"kv_fail.output_mismatch", "kv_fail.outputs_within_noise"}


def test_a_floor_not_clearly_below_the_sensitivity_is_inconclusive():
    """S/F under SEPARATION (10): the planted fault is not clearly above the noise."""
    s = kvr.summary(_noisy_facts(_c(0.2), _c(0.1), sens=1.4))  # 7x
    assert s["verdict"] == "inconclusive" and s["noise_floor"]["mode"] == "inconclusive"
    assert s["noise_floor"]["separation"] == 7.0
    (f,) = [x for x in s["findings"] if x["code"] == "kv_fail.comparison_inconclusive"]
    assert (
        "1.4" in f["message"] and "only 7.0x more" in f["message"] and "needs 10x" in f["message"]
    )


# the H100 hybrid runs of issue 45 (CUDA vLLM 0.26.0, default mode, bf16): the control
# phases drifted 0.029-0.031 (tokens equal), the targeted requests recovered bitwise,
# corrupted blocks moved outputs by 1.03-2.63, --no-patch runs differed by 1.28-2.36
GPU_DRIFT, GPU_EFFECT, NO_PATCH_DIFFS = 0.0307, 1.03, (1.28, 2.36)


def test_the_gpu_hybrid_seeds_pass_under_the_calibrated_rule():
    for drift in (0.029, 0.030, GPU_DRIFT):
        s = kvr.summary(_noisy_facts(_c(drift), _c(0.0), sens=GPU_EFFECT))
        assert s["verdict"] == "pass", (drift, s["findings"])
        nf = s["noise_floor"]
        assert nf["mode"] == "noise_floor" and nf["separation"] >= 33
        assert "kv_fail.outputs_within_noise" in _codes_of(s)
        # a recovered request that drifts as much as the controls do passes too
        s = kvr.summary(_noisy_facts(_c(drift), _c(drift), sens=GPU_EFFECT))
        assert s["verdict"] == "pass", s["findings"]


def test_a_planted_real_difference_still_fails_on_the_noisy_engine():
    for diff in NO_PATCH_DIFFS:
        missed = _c(diff, tokens=True)  # even with equal tokens
        s = kvr.summary(_noisy_facts(_c(GPU_DRIFT), missed, sens=GPU_EFFECT))
        assert s["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes_of(s)
        moved = _c(diff, tokens=False, first=0)
        s = kvr.summary(_noisy_facts(_c(GPU_DRIFT), moved, sens=GPU_EFFECT))
        assert s["verdict"] == "fail" and "kv_fail.output_mismatch" in _codes_of(s)


@pytest.mark.parametrize(
    ("sens", "mode"),
    [
        (10 * 0.03, "noise_floor"),  # exactly SEPARATION x F: conclusive
        (10 * 0.03 * 1.001, "noise_floor"),  # just inside
        (10 * 0.03 * 0.999, "inconclusive"),  # just outside
        (0.03, "inconclusive"),  # overlapping: the fault moves outputs as much as noise
        (0.01, "inconclusive"),  # the fault below the noise
    ],
)
def test_separation_edges(sens, mode):
    s = kvr.summary(_noisy_facts(_c(0.03), _c(0.0), sens=sens))
    assert s["noise_floor"]["mode"] == mode
    assert s["verdict"] == ("pass" if mode == "noise_floor" else "inconclusive")


@pytest.mark.parametrize(
    ("recovered", "verdict"),
    [
        (_c(2 * 0.03), "pass"),  # at the tolerance (2x floor)
        (_c(2 * 0.03 * 1.01), "fail"),  # just past it: moved beyond the noise
        (_c(0.03, tokens=False, first=3), "fail"),  # within the floor but a token changed
    ],
)
def test_tolerance_edges(recovered, verdict):
    s = kvr.summary(_noisy_facts(_c(0.03), recovered, sens=1.4))
    assert s["verdict"] == verdict, s["findings"]


def test_inconclusive_never_hides_a_failure():
    died = replace(_noisy_facts(_c(0.2), _c(0.1), sens=1.4), died_in="sensitivity")
    s = kvr.summary(died)
    assert s["verdict"] == "fail"
    assert {"kv_fail.engine_died", "kv_fail.comparison_inconclusive"} <= _codes_of(s)


def test_sweep_verdict_and_worst_seed():
    assert kvr.sweep_verdict(["pass", "pass"]) == "pass"
    assert kvr.sweep_verdict(["pass", "inconclusive", "pass"]) == "inconclusive"
    assert kvr.sweep_verdict(["inconclusive", "fail", "pass"]) == "fail"
    rows = [{"verdict": v} for v in ("pass", "inconclusive", "fail", "fail")]
    assert kvr.worst_seed(rows) == 2
    assert kvr.worst_seed(rows[:2]) == 1 and kvr.worst_seed(rows[:1]) == 0


def test_recovery_bug_needs_async_scheduling_or_the_v2_runner_and_a_large_difference():
    missed = _c(1.5, tokens=False, first=0)
    cpu = kvr.summary(_noisy_facts(_c(0.0), missed))
    assert "kv_fail.output_mismatch" in _codes_of(cpu)
    assert "kv_fail.vllm_recovery_bug" not in _codes_of(cpu)  # nothing recorded: no claim
    off = kvr.EngineFacts("0.32.0", "cpu", async_scheduling=False, v2_model_runner=False)
    assert "kv_fail.vllm_recovery_bug" not in _codes_of(
        kvr.summary(_noisy_facts(_c(0.0), missed, engine=off))
    )
    for engine in (replace(off, async_scheduling=True), replace(off, v2_model_runner=True)):
        s = kvr.summary(_noisy_facts(_c(0.0), missed, engine=engine))
        assert s["verdict"] == "fail" and "kv_fail.vllm_recovery_bug" in _codes_of(s)
    small = _c(0.1, tokens=False, first=9)  # far below what corrupted blocks cause (1.4)
    s = kvr.summary(_noisy_facts(_c(0.0), small, engine=replace(off, v2_model_runner=True)))
    assert "kv_fail.vllm_recovery_bug" not in _codes_of(s)
    no_recompute = replace(
        _noisy_facts(_c(0.0), missed, engine=replace(off, v2_model_runner=True)),
        accounting=dom.Accounting(),
    )
    assert "kv_fail.vllm_recovery_bug" not in _codes_of(kvr.summary(no_recompute))


def test_engine_facts_read_the_schedulers_settings():
    e = kvr.engine_facts({"async_scheduling": True, "v2_model_runner": False}, [])
    assert (e.async_scheduling, e.v2_model_runner) == (True, False)
    e = kvr.engine_facts({"async_scheduling": None, "v2_model_runner": "yes"}, [])
    assert (e.async_scheduling, e.v2_model_runner) == (None, None)
    assert kvr.engine_facts({}, []).async_scheduling is None
