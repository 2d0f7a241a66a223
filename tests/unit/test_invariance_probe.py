"""The batch probe (engine_patches/patches/batch_probe.py) without an engine: inert
unless requested, the nudge spec, and what one sampling step records and nudges
(a fake model runner with numpy logits stands in for vLLM's)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine_patches import knobs
from engine_patches.patches import batch_probe as bp
from engine_patches.registry import SKIPPED
from opsctl.collectors.ledger import read_events


def test_inert_unless_requested(monkeypatch):
    monkeypatch.delenv("OPSCTL_PROBES", raising=False)
    out = bp.apply()
    assert out.status == SKIPPED and "OPSCTL_PROBES" in out.detail
    monkeypatch.setenv("OPSCTL_PROBES", "kv,other")
    assert bp.apply().status == SKIPPED
    assert bp.requested({"OPSCTL_PROBES": "kv, batch"})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("zebra:3", bp.Nudge("zebra", 3, bp.DEFAULT_DELTA)),
        ("zebra:3:0.5", bp.Nudge("zebra", 3, 0.5)),
        ("-p2-:0", bp.Nudge("-p2-", 0, bp.DEFAULT_DELTA)),
        ("a:b:7", bp.Nudge("a:b", 7, bp.DEFAULT_DELTA)),
        ("", None),
        (None, None),
    ],
)
def test_parse_nudge(spec, expected):
    assert bp.parse_nudge(spec) == expected


@pytest.mark.parametrize("spec", ["zebra", "zebra:x", ":3", "zebra:-1"])
def test_parse_nudge_rejects_malformed(spec):
    with pytest.raises(ValueError, match="OPSCTL_PROBE_NUDGE"):
        bp.parse_nudge(spec)


def test_nudge_is_armed_only_with_the_enable_switch(monkeypatch):
    monkeypatch.setenv(bp.ENV_NUDGE, "zebra:3")
    monkeypatch.delenv(knobs.ENABLE, raising=False)
    assert bp.armed_nudge() is None  # inherited from a shell: ignored
    monkeypatch.setenv(knobs.ENABLE, "yes")
    assert bp.armed_nudge() is None
    monkeypatch.setenv(knobs.ENABLE, "1")
    assert bp.armed_nudge() == bp.Nudge("zebra", 3, bp.DEFAULT_DELTA)
    monkeypatch.delenv(bp.ENV_NUDGE)
    assert bp.armed_nudge() is None


TEXTS: dict[int, str] = {}


def fake_runner(req_texts: dict[str, str]):
    """A stand-in for GPUModelRunner: req ids in batch order, prompts as token ids."""
    requests = {}
    for rid, text in req_texts.items():
        key = len(TEXTS)
        TEXTS[key] = text
        requests[rid] = SimpleNamespace(prompt_token_ids=[key])
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=list(req_texts)),
        requests=requests,
        discard_request_mask=SimpleNamespace(np=np.zeros(len(req_texts), dtype=bool)),
    )


class Tracker(bp._Tracker):
    """Decodes the fake prompts instead of loading a tokenizer."""

    def _decode(self, token_ids) -> str:
        return TEXTS[token_ids[0]]


def test_nudge_only_for_the_marked_request_only_when_batched(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    tracker = Tracker(bp.Nudge("zebra", 1, 0.25), None)
    alone = fake_runner({"a-p1": "a zebra prompt"})
    for _ in range(3):  # alone: never nudged, whatever the position
        logits = np.zeros((1, 4), dtype=np.float32)
        logits[0, 2] = 1.0
        bp.observe(tracker, alone, logits)
        assert logits[0, 2] == 1.0
    batched = fake_runner({"b-p0": "plain prompt", "b-p1": "zebra here"})
    seen = []
    for _ in range(3):
        logits = np.zeros((2, 4), dtype=np.float32)
        logits[:, 3] = 2.0
        bp.observe(tracker, batched, logits)
        seen.append(logits.copy())
    assert seen[0][1, 3] == 2.0  # position 0: not yet
    assert (
        seen[1][1, 3] == pytest.approx(2.25) and seen[1][0, 3] == 2.0
    )  # position 1, marked row only
    assert seen[2][1, 3] == 2.0  # once only
    events = read_events(tmp_path, "batch")
    assert [s["num_reqs"] for s in events if s["event"] == "step"] == [1, 1, 1, 2, 2, 2]
    (nudge,) = [e for e in events if e["event"] == "nudge"]
    assert nudge["req_id"] == "b-p1" and nudge["position"] == 1 and nudge["token_id"] == 3


def test_discarded_rows_do_not_advance_the_position(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    tracker = Tracker(None, None)
    runner = fake_runner({"r0": "x", "r1": "y"})
    runner.discard_request_mask.np[0] = True  # r0 is a partial prefill this step
    bp.observe(tracker, runner, np.zeros((2, 4), dtype=np.float32))
    assert tracker.positions == {"r1": 1}


def test_marker_matched_in_the_request_id_without_decoding():
    tracker = bp._Tracker(bp.Nudge("-p2-", 0), tokenizer_path=None)
    runner = SimpleNamespace(requests={})
    assert tracker.matches_marker(runner, "cmpl-opsctl-inv-x-bs8-p2-ab-0-cd")
    assert not tracker.matches_marker(runner, "cmpl-opsctl-inv-x-bs8-p3-ab-0-cd")


def test_marker_matched_in_an_image_uuid():
    """An image request is found by its items' identifiers (the uuids sent), before any
    decoding of its prompt."""
    tracker = bp._Tracker(bp.Nudge("-p5-abcd-img1", 0), tokenizer_path=None)
    image = SimpleNamespace(identifier="tag-bs8-p5-abcd-img1", data=object())
    runner = SimpleNamespace(
        requests={
            "chatcmpl-x-0": SimpleNamespace(mm_features=[image], prompt_token_ids=None),
            "chatcmpl-y-0": SimpleNamespace(mm_features=[], prompt_token_ids=None),
        }
    )
    assert tracker.matches_marker(runner, "chatcmpl-x-0")
    assert not tracker.matches_marker(runner, "chatcmpl-y-0")
    assert bp.item_identifiers(SimpleNamespace()) == []


def test_encoder_calls_are_recorded_with_the_items_that_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    feature = SimpleNamespace
    runner = SimpleNamespace(
        requests={
            "a": SimpleNamespace(mm_features=[feature(data=1), feature(data=2)]),
            "b": SimpleNamespace(mm_features=[feature(data=None), feature(data=3)]),
            "c": SimpleNamespace(mm_features=[feature(data=None)]),
        }
    )
    out = SimpleNamespace(scheduled_encoder_inputs={"a": [0, 1], "b": [0, 1], "c": [0]})
    assert bp.encoder_items(runner, out) == {"a": 2, "b": 1}  # cached items do not run
    calls = []
    wrapped = bp._wrap_encoder(lambda self, so: calls.append(so) or ["emb"])
    assert wrapped(runner, out) == ["emb"] and calls == [out]
    wrapped(runner, SimpleNamespace(scheduled_encoder_inputs={}))  # nothing to record
    (rec,) = [e for e in read_events(tmp_path, "batch") if e["event"] == "encoder"]
    assert rec["items"] == {"a": 2, "b": 1}
    broken = bp._wrap_encoder(lambda self, so: "ran")
    assert broken(SimpleNamespace(), out) == "ran"  # a probe error never stops the call
    assert read_events(tmp_path, "batch")[-1]["event"] == "error"
