"""Unit tests of diag mm-uuid's judgement (opsctl.suite.mm_uuid.judge)."""

from __future__ import annotations

import pytest

from opsctl.suite.mm_uuid import judge as D
from opsctl.suite.mm_uuid.run import TABLE_COLUMNS, table_rows

HASH = "a" * 64


def obs(
    mode, explicit, identifier, *, status=200, color="red", case="c", index=0, output=None
) -> D.Observation:
    sent = repr(explicit) if explicit is not None else "null"
    return D.Observation(mode, case, index, color, sent, explicit, identifier, status, output)


@pytest.mark.parametrize(
    ("o", "verdict"),
    [
        (obs(D.CACHES_OFF, "my-uuid", "my-uuid"), "pass"),
        (obs(D.CACHES_OFF, "", ""), "pass"),  # empty string is explicit (vLLM: `is not None`)
        (obs(D.CACHES_OFF, None, "renderer0-mm-3-image-0"), "pass"),
        (obs(D.CACHES_ON, None, HASH), "pass"),
        (obs(D.CACHES_ON, "my-uuid", "my-uuid"), "pass"),
        # the pre-fix behaviour: an explicit UUID replaced by a request-local id
        (obs(D.CACHES_OFF, "my-uuid", "renderer0-mm-3-image-0"), "fail"),
        (obs(D.CACHES_OFF, "my-uuid", "my-uuid~rewritten"), "fail"),
        (obs(D.CACHES_OFF, "", "renderer0-mm-1-image-0"), "fail"),
        (obs(D.CACHES_OFF, None, HASH), "fail"),  # caches off must not hash
        (obs(D.CACHES_ON, None, "renderer0-mm-1-image-0"), "fail"),
        (obs(D.CACHES_OFF, "x", None), "fail"),  # probe saw nothing
        (obs(D.CACHES_OFF, "x", "x", status=400), "fail"),
    ],
)
def test_judge_item(o, verdict) -> None:
    assert D.judge_item(o)[0] == verdict


def test_classify() -> None:
    assert D.classify(HASH) == "content hash"
    assert D.classify("renderer0-mm-12-image-0") == "request-local"
    assert D.classify("my-uuid~rewritten") == "other"
    assert D.classify(None) == "missing"


def test_default_cases_cover_the_four_semantics() -> None:
    cases = D.default_cases("p")
    assert [c.name for c in cases] == [
        "all explicit",
        "some explicit, some None",
        "empty string",
        "no UUIDs",
    ]
    assert all(i.explicit for i in cases[0].items)
    assert [i.explicit for i in cases[1].items] == [True, False] and cases[1].items[1].uuid is None
    assert cases[2].items[0].uuid == "" and cases[2].items[0].explicit
    assert all(i.uuid == D.ABSENT and not i.explicit for i in cases[3].items)
    assert all(i.uuid.startswith("p-") for c in cases[:2] for i in c.items if i.explicit)


def test_findings_fail_on_rewrite_and_pass_otherwise() -> None:
    good = [
        obs(D.CACHES_OFF, "u1", "u1"),
        obs(D.CACHES_OFF, None, "r-mm-1-image-0"),
        obs(D.CACHES_OFF, None, "r-mm-2-image-0"),
        obs(D.CACHES_ON, None, HASH, color="red"),
        obs(D.CACHES_ON, None, HASH, color="red"),
    ]
    f = D.findings(good)
    assert not [x for x in f if x.severity == "fail"]
    assert {x.code for x in f} >= {"mm_uuid.kept", "mm_uuid.content_hash"}
    bad = D.findings([*good, obs(D.CACHES_OFF, "u2", "u2~rewritten")])
    assert [x.code for x in bad if x.severity == "fail"] == ["mm_uuid.rewritten"]


def test_request_local_ids_must_not_collide() -> None:
    f = D.findings(
        [obs(D.CACHES_OFF, None, "r-mm-1-image-0"), obs(D.CACHES_OFF, None, "r-mm-1-image-0")]
    )
    assert "mm_uuid.collision" in {x.code for x in f if x.severity == "fail"}


def test_empty_string_is_a_warning() -> None:
    f = D.findings([obs(D.CACHES_OFF, "", "")])
    assert [x.code for x in f if x.severity == "warning"] == ["mm_uuid.empty_string"]


def test_reuse_is_a_warning_with_output_evidence() -> None:
    reuse = [
        obs(D.CACHES_OFF, "u", "u", color="red", output="A"),
        obs(D.CACHES_OFF, "u", "u", color="blue", output="A"),
        obs(D.CACHES_OFF, None, "r-mm-9-image-0", color="blue", output="B"),
    ]
    (f,) = D.reuse_findings(reuse)
    assert f.severity == "warning" and f.code == "mm_uuid.reuse_accepted" and "stale" in f.message
    reuse[1] = obs(D.CACHES_OFF, "u", "u", color="blue", output="B")
    (f,) = D.reuse_findings(reuse)
    assert "no stale reuse" in f.message
    rejected = [reuse[0], obs(D.CACHES_OFF, "u", None, status=400), reuse[2]]
    assert D.reuse_findings(rejected)[0].code == "mm_uuid.reuse_rejected"


def test_table_rows() -> None:
    rows = table_rows([obs(D.CACHES_OFF, "", ""), obs(D.CACHES_OFF, "u", None)])
    assert rows[0][5] == "'' (empty)" and rows[0][-1] == "PASS"
    assert rows[1][5] == "(not recorded)" and rows[1][-1] == "FAIL"
    assert len(rows[0]) == len(TABLE_COLUMNS)


def test_request_local_index_must_match_the_position() -> None:
    base = dict(
        mode=D.CACHES_OFF,
        case="c",
        index=1,
        color="green",
        sent="null",
        explicit_uuid=None,
        status=200,
    )
    at1 = D.Observation(
        **base, identifier="r-mm-1-image-1", position=1, sent_items=2, engine_items=2
    )
    assert D.judge_item(at1)[0] == "pass"
    wrong = D.Observation(
        **base, identifier="r-mm-1-image-0", position=1, sent_items=2, engine_items=2
    )
    v, why = D.judge_item(wrong)
    assert v == "fail" and "'-image-1'" in why


def test_engine_item_count_and_missing_record() -> None:
    base = dict(
        mode=D.CACHES_OFF, case="c", index=0, color="red", sent="'u'", explicit_uuid="u", status=200
    )
    extra = D.Observation(**base, identifier="u", engine_items=2)
    assert D.judge_item(extra) == ("fail", "the engine core saw 2 item(s) for a request of 1")
    lost = D.Observation(**base, identifier=None, note="no engine record for request chatcmpl-9")
    assert D.judge_item(lost) == ("fail", "no engine record for request chatcmpl-9")


def test_one_image_per_request_is_stated() -> None:
    one = D.Observation(D.CACHES_OFF, "c", 0, "red", "'u'", "u", "u", 200)
    codes = {f.code: f.severity for f in D.findings([one])}
    assert codes["mm_uuid.one_image_per_request"] == "info"
    two = D.Observation(
        D.CACHES_OFF, "c", 0, "red", "'u'", "u", "u", 200, sent_items=2, engine_items=2
    )
    assert "mm_uuid.one_image_per_request" not in {f.code for f in D.findings([two])}
    assert "1 image per prompt: mixed case sent as separate requests" in (
        D.one_image_finding().message
    )


SOME = D.default_cases("p")[1].items  # explicit 'p-some-0', then None


def test_batches_keep_the_case_index() -> None:
    items = D.reuse_case("p").items
    assert D.batches(items, 2) == [[(0, items[0]), (1, items[1])], [(2, items[2])]]
    assert D.batches(items, 1) == [[(i, it)] for i, it in enumerate(items)]


def test_observe_matches_recorded_items_by_position() -> None:
    record = D.EngineRecord("chatcmpl-7-ab", ("p-some-0", "r-mm-7-image-1"))
    reply = D.ChatReply(200, "out", "chatcmpl-7", record)
    a, b = D.observe(D.CACHES_OFF, "mixed", [(0, SOME[0]), (1, SOME[1])], reply)
    assert (a.identifier, a.kind, a.explicit_uuid, a.position) == (
        "p-some-0",
        "kept",
        "p-some-0",
        0,
    )
    assert (b.identifier, b.sent, b.explicit_uuid, b.position) == (
        "r-mm-7-image-1",
        "null",
        None,
        1,
    )
    assert a.request_id == b.request_id == "chatcmpl-7-ab" and a.output == "out"
    assert a.sent_items == a.engine_items == 2 and D.judge_item(b)[0] == "pass"


def test_observe_says_why_an_item_has_no_identifier() -> None:
    lost = D.observe(D.CACHES_OFF, "c", [(0, SOME[0])], D.ChatReply(200, "x", "chatcmpl-9"))
    assert lost[0].identifier is None and lost[0].engine_items is None
    assert D.judge_item(lost[0]) == ("fail", "no engine record for request chatcmpl-9")
    short = D.EngineRecord("chatcmpl-3-x", ("p-some-0",))
    _, b = D.observe(
        D.CACHES_OFF, "c", [(0, SOME[0]), (1, SOME[1])], D.ChatReply(200, "x", "chatcmpl-3", short)
    )
    assert b.note == "the engine record has no item #1" and b.engine_items == 1
    assert "saw 1 item(s) for a request of 2" in D.judge_item(b)[1]
    broken = D.EngineRecord("chatcmpl-4-x", (), error="boom")
    (c,) = D.observe(D.CACHES_OFF, "c", [(0, SOME[0])], D.ChatReply(200, "x", "chatcmpl-4", broken))
    assert c.note == "the probe failed on request chatcmpl-4: boom"
    (d,) = D.observe(D.CACHES_OFF, "c", [(0, SOME[0])], D.ChatReply(400, error_text="no images"))
    assert D.judge_item(d) == ("fail", "request failed with HTTP 400")


def test_image_refusal_only_for_the_first_request() -> None:
    rejected = D.ChatReply(400, error_text="not multimodal")
    refusal = D.image_refusal(rejected, True, "http://h:1", "tiny-vlm-multi")
    assert refusal is not None and "rejected an image request: not multimodal" in str(refusal)
    assert "--model tiny-vlm-multi" in (refusal.hint or "")
    assert D.image_refusal(rejected, False, "http://h:1", "m") is None
    assert D.image_refusal(D.ChatReply(200), True, "http://h:1", "m") is None


def test_probe_state_and_engine_mode() -> None:
    assert D.probe_state(()) == (False, "no engine-core ledger entry for mm_uuid_probe")
    assert D.probe_state((("skipped", "old"), ("applied", "ok"))) == (True, "applied: ok")
    assert D.probe_state((("applied", ""), ("failed", "boom")))[0] is False
    off = {"enable_prefix_caching": False, "mm_processor_cache_gb": 0.0}
    assert D.engine_mode(off) == (D.CACHES_OFF, off)
    assert D.engine_mode({"enable_prefix_caching": False, "mm_processor_cache_gb": 4})[0] == (
        D.CACHES_ON
    )
    assert D.engine_mode(None) == ("unknown", {})


def test_summary() -> None:
    good, bad = obs(D.CACHES_OFF, "u", "u"), obs(D.CACHES_OFF, "u", "v")
    assert D.summary([good, bad]) == "1/2 items as expected"
