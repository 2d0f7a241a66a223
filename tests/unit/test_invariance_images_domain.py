"""Pure parts of batch invariance with images (opsctl/suite/invariance/judge_images.py), the
multimodal read-back of the isolating settings (judge_engine.py there), the platform
(domain/platform.py), the chat response parser (suite/invariance/collect_images.py) and
the engine_info probe's multimodal fields (engine_patches/patches/engine_info.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine_patches.patches import engine_info
from opsctl.collectors.completions import CompletionParams, parse_chat
from opsctl.domain import platform as plat
from opsctl.errors import BadInput
from opsctl.suite.invariance import judge_engine as eng
from opsctl.suite.invariance import judge_images as img
from opsctl.suite.invariance.collect_images import chat_body, messages

TAGS = ("t-default-bs1", "t-default-bs4")


def test_every_image_is_different_and_counts_cycle():
    assert len({img.colour(k) for k in range(256)}) == 256
    assert img.counts(6, 4) == (1, 2, 3, 4, 1, 2)
    assert img.counts(3, 1) == (1, 1, 1) and img.counts(2, 0) == (0, 0)
    plan = img.plan(8, 4)
    assert [len(p) for p in plan] == [1, 2, 3, 4, 1, 2, 3, 4]
    flat = [c for p in plan for c in p]
    assert len(set(flat)) == len(flat) == 20
    assert img.plan(8, 4) == plan  # deterministic


@pytest.mark.parametrize(
    ("multimodal", "limit", "requested", "expected"),
    [(True, 4, None, 4), (True, 1, None, 1), (False, 1, None, 0), (True, 4, 0, 0), (True, 4, 2, 2)],
)
def test_images_for(multimodal, limit, requested, expected):
    assert img.images_for(multimodal, limit, requested, "m") == expected


def test_images_for_a_text_model_are_bad_input():
    with pytest.raises(BadInput, match="m is not a vision-language model"):
        img.images_for(False, 1, 2, "m")


@pytest.mark.parametrize(
    ("catalog", "engine", "expected"),
    [(4, None, 4), (4, 2, 2), (4, 0, 4), (None, 3, 3), (None, 999, 1), (None, None, 1)],
)
def test_model_limit(catalog, engine, expected):
    assert img.model_limit(catalog, engine) == expected


def mm_record(tag: str, i: int, n: int, *, uuids: bool = True) -> dict:
    rid = f"chatcmpl-{tag}-p{i}-abcd1234-ffff"
    ident = (lambda j: f"{tag}-p{i}-abcd1234-img{j}") if uuids else (lambda j: f"r-mm-{j}")
    return {"request_id": rid, "items": [{"index": j, "identifier": ident(j)} for j in range(n)]}


def test_received_and_encoded_items_per_prompt():
    events = [mm_record(TAGS[1], 0, 1), mm_record(TAGS[1], 1, 2, uuids=False)]
    events.append({"request_id": f"chatcmpl-{TAGS[1]}-p2-x", "error": "boom"})
    events.append(mm_record(TAGS[0], 0, 1))  # the other phase
    assert img.received_items(events, TAGS[1], 3) == ((1, 2, None), 1)
    batch = [
        {"event": "step", "req_ids": ["x"]},
        {"event": "encoder", "items": {f"c-{TAGS[1]}-p0-a": 1, f"c-{TAGS[1]}-p1-b": 2}},
        {"event": "encoder", "items": {f"c-{TAGS[1]}-p2-c": 1, "other": 5}},
    ]
    assert img.encoded_items(batch, TAGS[1], 3) == ((1, 2, 1), 2)
    assert img.encoded_items([{"event": "step"}], TAGS[1], 3) == ((), None)


def probe_evidence(sent, received_n, encoded_n=None):
    mm = [mm_record(t, i, n) for t in TAGS for i, n in enumerate(received_n)]
    batch = []
    if encoded_n is not None:
        for t in TAGS:
            items = {f"c-{t}-p{i}-h": n for i, n in enumerate(encoded_n) if n}
            batch.append({"event": "encoder", "items": items})
    return img.evidence(sent, TAGS, mm_events=mm, batch_events=batch)


def test_evidence_from_the_probes():
    ev = probe_evidence([1, 2], [1, 2], [1, 2])
    assert ev.reached and ev.missing() == [] and ev.identifiers_matched == 6
    assert ev.encoder_max_batch == 2 and ev.to_dict()["received"] == {
        "BS=1": [1, 2],
        "BS=N": [1, 2],
    }
    assert img.assess(ev, 2) == ([], [])
    short = probe_evidence([1, 2], [1, 1], [1, 1])
    assert not short.reached
    assert short.missing() == [
        "BS=1 prompt 1: engine core received 1 of 2 image(s)",
        "BS=N prompt 1: engine core received 1 of 2 image(s)",
    ]
    failures, _ = img.assess(short, 2)
    assert (
        failures[0]
        == "images did not reach the engine: BS=1 prompt 1: engine core received 1 of 2 image(s)"
    )
    not_encoded = probe_evidence([1, 2], [1, 2], [1, 0])
    assert "BS=1 prompt 1: vision encoder ran 0 of 2 image(s)" in not_encoded.missing()
    no_encoder_records = probe_evidence([1, 2], [1, 2])  # an older probe: received is enough
    assert no_encoder_records.reached and no_encoder_records.encoded == {}


def test_evidence_without_probes_or_with_nothing():
    tokens = {"BS=1": [7, 14], "BS=N": [7, None]}
    ev = img.evidence([1, 2], TAGS, mm_events=None, batch_events=[], image_tokens=tokens)
    assert ev.source == img.USAGE_SOURCE
    assert ev.missing() == ["BS=N prompt 1: no prompt_tokens / text-only count to compare"]
    ignored = img.evidence(
        [1, 2], TAGS, mm_events=None, batch_events=[], image_tokens={"BS=1": [0, 0], "BS=N": [0, 0]}
    )
    assert ignored.missing()[0] == "BS=1 prompt 0: 0 image token(s) counted for 1 image(s)"
    failures, warnings = img.assess(ignored, 2)
    assert len(failures) == 4 and "token counts only" in warnings[0]
    nothing = img.evidence([1], TAGS, mm_events=None, batch_events=[])
    assert nothing.source == "none" and not nothing.reached
    assert (
        nothing.missing()[0]
        == "BS=1 prompt 0: nothing shows that its 1 image(s) reached the engine"
    )
    assert img.assess(img.evidence([0, 0], TAGS, mm_events=None, batch_events=[]), 2) == ([], [])


def test_a_lone_encoder_batch_is_a_warning():
    ev = probe_evidence([1, 1], [1, 1], [1, 1])
    lone = img.ImageEvidence(ev.source, ev.sent, ev.received, ev.encoded, {}, 4, 1)
    failures, warnings = img.assess(lone, 2)
    assert failures == [] and "encoded in one encoder call" in warnings[0]


def test_mm_processor_cache_must_be_recorded_when_images_are_sent():
    info = {"enable_prefix_caching": False, "mm_processor_cache_gb": None}
    text = eng.check_engine_settings(info, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, mode=None)
    assert [s.status for s in text][:2] == [eng.VERIFIED, eng.NOT_APPLICABLE]
    images = eng.check_engine_settings(info, None, mode=None, images=True)
    assert (images[1].status, images[1].seen) == (eng.MISMATCH, "not recorded")
    info["mm_processor_cache_gb"] = 4.0
    assert eng.check_engine_settings(info, None, mode=None, images=True)[1].status == eng.MISMATCH
    info["mm_processor_cache_gb"] = 0.0
    assert eng.check_engine_settings(info, None, mode=None, images=True)[1].status == eng.VERIFIED


def test_platform_from_server_info_and_labels():
    as_json = {"vllm_config": {"device_config": {"device": "cuda", "device_type": "cuda"}}}
    assert plat.from_server_info(as_json) == "cuda"
    assert plat.from_server_info({"vllm_config": "model='m', device_config=xpu, seed=0"}) == "xpu"
    assert plat.from_server_info({"vllm_config": {"device_config": {"device": "auto"}}}) is None
    assert plat.from_server_info(None) is None and plat.from_server_info({"x": 1}) is None
    assert plat.label(None, "cpu") == "cpu" and plat.label(None) == plat.NOT_STARTED
    assert plat.joined(["cpu", None, "cpu", "?", "xpu"]) == "cpu, xpu"
    assert plat.joined([None]) is None
    assert eng.platform_of(None, None) is None
    assert eng.platform_of(None, {"platform": "rocm"}) == "rocm"


def test_chat_body_and_response():
    params = CompletionParams("m", 2, 2)
    body = chat_body(params, "hi", [(1, 2, 3), (4, 5, 6)], "tag-p0-abcd")
    parts = body["messages"][0]["content"]
    assert [p.get("uuid") for p in parts] == ["tag-p0-abcd-img0", "tag-p0-abcd-img1", None]
    assert parts[-1] == {"type": "text", "text": "hi"} and body["request_id"] == "tag-p0-abcd"
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["ignore_eos"] is True
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "uuid" not in messages("hi", [(1, 2, 3)], None)[0]["content"][0]
    content = [
        {
            "token": "token_id:5",
            "logprob": -0.5,
            "top_logprobs": [{"token": "token_id:5", "logprob": -0.5}],
        },
        {
            "token": "token_id:7",
            "logprob": -1.0,
            "top_logprobs": [{"token": "token_id:7", "logprob": -1.0}],
        },
    ]
    payload = {
        "choices": [{"finish_reason": "length", "logprobs": {"content": content}}],
        "usage": {"prompt_tokens": 21},
    }
    g = parse_chat(200, payload)
    assert (g.token_ids, g.logprobs, g.prompt_tokens) == ((5, 7), (-0.5, -1.0), 21)
    assert g.top_logprobs == ({5: -0.5}, {7: -1.0}) and g.finish_reason == "length"
    assert parse_chat(200, {"choices": [{"logprobs": None}]}).has_logprobs is False
    assert (
        parse_chat(400, {"error": {"message": "too many images"}}).error
        == "HTTP 400: too many images"
    )


def scheduler(mm) -> SimpleNamespace:
    model = SimpleNamespace(model="m", multimodal_config=mm, enforce_eager=True)
    vc = SimpleNamespace(
        model_config=model,
        cache_config=SimpleNamespace(enable_prefix_caching=False),
        compilation_config=SimpleNamespace(mode="0"),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        kv_transfer_config=None,
    )
    kv = SimpleNamespace(kv_cache_groups=[], num_blocks=4)
    return SimpleNamespace(kv_cache_config=kv, vllm_config=vc)


def test_engine_info_records_the_multimodal_settings():
    mm = SimpleNamespace(
        mm_processor_cache_gb=0.0,
        mm_processor_cache_type="lru",
        limit_per_prompt={"image": SimpleNamespace(count=4)},
    )
    d = engine_info.describe(scheduler(mm))
    assert (d["multimodal"], d["mm_processor_cache_gb"], d["limit_mm_per_prompt"]) == (
        True,
        0.0,
        {"image": 4},
    )
    assert d["mm_processor_cache_type"] == "lru"
    text = engine_info.describe(scheduler(None))
    assert text["multimodal"] is False
    assert text["mm_processor_cache_gb"] is None and text["limit_mm_per_prompt"] is None


def test_a_text_only_run_has_nothing_to_show():
    ev = img.evidence([0, 0], TAGS, mm_events=None, batch_events=[])
    assert (ev.source, ev.reached, ev.missing()) == (img.TEXT_ONLY, None, [])
    mixed = img.evidence([0, 1], TAGS, mm_events=None, batch_events=[])
    assert [m.split(":")[0] for m in mixed.missing()] == ["BS=1 prompt 1", "BS=N prompt 1"]


def test_a_top_logprob_without_a_value_is_left_out_not_a_crash():
    """One parse_chat for LoRA and images (opsctl.collectors.completions): the LoRA copy
    it replaced called float(None) on a top-logprob entry without a logprob."""
    item = {"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "a", "logprob": None}]}
    payload = {"choices": [{"logprobs": {"content": [item]}, "finish_reason": "length"}]}
    g = parse_chat(200, payload)
    assert g.logprobs == (-0.5,) and g.top_logprobs == ({},) and g.finish_reason == "length"
