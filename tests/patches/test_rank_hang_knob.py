"""The OPSCTL_HANG_RANK test knob (engine_patches/patches/rank_hang_knob.py) without an
engine: inert unless set through engine_patches.knobs, a bad value is a failed outcome (never
an engine error), the wrapper blocks only the named rank and only while the file exists, and
it wraps vLLM 0.32's real VocabParallelEmbedding.forward. On a real TP=2 engine (the peer in
the all-reduce): tests/e2e/test_rank_hang_e2e.py."""

from __future__ import annotations

import sys
import threading

import pytest

from engine_patches import knobs
from engine_patches.patch import APPLIED, FAILED, SKIPPED
from engine_patches.patches import rank_hang_knob as P
from tests.standins.patch_env import clean_patch_env
from tests.waiting import wait_until


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    clean_patch_env(monkeypatch, tmp_path, knobs.ENABLE, knobs.HANG_RANK)
    yield
    P.ORIGINALS.restore()


def test_inert_unless_set_through_the_knobs(monkeypatch, tmp_path):
    assert P.apply().status == SKIPPED
    monkeypatch.setenv(knobs.HANG_RANK, f"TP1:{tmp_path / 'hold'}")  # stray: no ENABLE
    assert P.apply().status == SKIPPED
    assert knobs.HANG_RANK in knobs.KNOBS and P.PATCH.roles == ("worker",)


@pytest.mark.parametrize(
    "value,parsed",
    [("TP1:/tmp/hold", (1, "/tmp/hold")), ("TP0:/a:b", (0, "/a:b")), ("DP1:/x", None), ("1", None)],
)
def test_parse(value, parsed):
    assert P.parse(value) == parsed


def test_a_bad_value_is_a_failed_outcome(monkeypatch):
    monkeypatch.setenv(knobs.ENABLE, "1")
    monkeypatch.setenv(knobs.HANG_RANK, "rank1")
    out = P.apply()
    assert out.status == FAILED and "expected TP<rank>:FILE" in out.detail


def test_only_the_named_rank_blocks_and_only_while_the_file_exists(tmp_path):
    trigger = tmp_path / "hold"
    trigger.touch()
    calls: list[int] = []
    forward = P.hang_rank(1, str(trigger))(lambda self, x: calls.append(self.tp_rank) or x)

    class Layer:
        def __init__(self, rank: int) -> None:
            self.tp_rank = rank

    assert forward(Layer(0), 5) == 5 and calls == [0]  # the peer goes on into its all-reduce
    done = threading.Event()
    held = threading.Thread(target=lambda: (forward(Layer(1), 7), done.set()), daemon=True)
    held.start()

    def in_planted_hang() -> bool:
        frame = sys._current_frames().get(held.ident)
        while frame is not None and frame.f_code.co_name != "planted_hang":
            frame = frame.f_back
        return frame is not None

    wait_until(in_planted_hang, 30, "the held rank blocking in planted_hang")
    assert not done.is_set() and calls == [0]  # before its original (and its all-reduce)
    trigger.unlink()
    wait_until(done.is_set, 30, "the held rank going on once the file is gone")
    assert calls == [0, 1]


def test_it_wraps_vllms_vocab_parallel_embedding_forward(monkeypatch, tmp_path):
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding as E

    original = E.forward
    monkeypatch.setenv(knobs.ENABLE, "1")
    monkeypatch.setenv(knobs.HANG_RANK, f"TP1:{tmp_path / 'hold'}")
    out = P.apply()
    assert (
        out.status == APPLIED and "TP rank 1 blocks in VocabParallelEmbedding.forward" in out.detail
    )
    assert E.forward is not original and E.forward.__wrapped__ is original
    assert P.apply().status == APPLIED and E.forward.__wrapped__ is original  # once only
    P.ORIGINALS.restore()
    assert E.forward is original
