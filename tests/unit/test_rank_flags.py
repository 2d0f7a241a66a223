"""opsctl.domain.rank_flags: one rank grammar (--tp/--dp or vLLM's flags), head refusals."""

from __future__ import annotations

import pytest

from opsctl.domain import rank_flags as rf

LLAMA = {"num_attention_heads": 4, "num_key_value_heads": 2}  # the tiny models' heads


@pytest.mark.parametrize(
    ("args", "tp", "dp", "rest"),
    [
        ([], None, None, ()),
        (["--tensor-parallel-size", "2"], 2, None, ()),
        (["-tp", "2", "--max-model-len", "128"], 2, None, ("--max-model-len", "128")),
        (["--tensor_parallel_size=2"], 2, None, ()),
        (["-tp=2", "-dp", "3"], 2, 3, ()),
        (["--data-parallel-size", "2", "--seed", "1"], None, 2, ("--seed", "1")),
        # not rank sizes: vLLM's other data-parallel flags are left to vLLM
        (["--data-parallel-size-local", "1", "-dpl", "1"], None, None,
         ("--data-parallel-size-local", "1", "-dpl", "1")),
    ],
)  # fmt: skip
def test_split_reads_vllms_spellings(args, tp, dp, rest):
    assert rf.split(args) == rf.RankArgs(tp, dp, rest)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-tp", "2", "--tensor-parallel-size", "2"], "TP size is given twice"),
        (["--data-parallel-size"], "needs a value"),
        (["-tp", "two"], "whole number"),
        (["-dp", "0"], "at least 1"),
    ],
)
def test_split_refuses(args, words):
    with pytest.raises(ValueError, match=words):
        rf.split(args)


def test_merge_takes_one_way_or_the_other_never_both():
    assert rf.merge(2, None, ["--seed", "1"]) == rf.RankArgs(2, 1, ("--seed", "1"))
    assert rf.merge(None, None, ["-dp", "2"]) == rf.RankArgs(1, 2, ())
    assert rf.merge(None, None, []) == rf.RankArgs(1, 1, ())
    with pytest.raises(ValueError, match=r"TP size is given twice: --tp 2 and vLLM's"):
        rf.merge(2, None, ["--tensor-parallel-size", "2"])
    with pytest.raises(ValueError, match="DP size is given twice"):
        rf.merge(None, 1, ["-dp=2"])  # even when they agree on nothing
    with pytest.raises(ValueError, match="--tp must be at least 1"):
        rf.merge(0, None, [])


@pytest.mark.parametrize(
    ("config", "tp", "refused"),
    [
        (LLAMA, 1, None),
        (LLAMA, 2, None),
        (LLAMA, 4, None),  # 2 KV heads, each on two ranks (vLLM replicates them)
        (LLAMA, 3, "4 attention heads"),  # vLLM's config check refuses it
        ({"num_attention_heads": 8, "num_key_value_heads": 3}, 2, "3 KV heads"),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, 3, "4 KV heads"),
        ({"num_attention_heads": 4}, 2, None),  # no num_key_value_heads: as many as heads
        ({"text_config": {"num_attention_heads": 4, "num_key_value_heads": 2}}, 3, "4 attention"),
        ({"architectures": ["X"]}, 3, None),  # no heads named: vLLM decides
    ],
)
def test_head_refusal_is_vllms_rule(config, tp, refused):
    why = rf.head_refusal(config, tp, "m")
    assert (why is None) if refused is None else (refused in why), why


def test_the_hint_lists_the_sizes_the_heads_allow():
    assert rf.divisors_hint(LLAMA, 8) == "--tp 1 or 2 or 4"


def test_argv_is_vllms_spelling_and_nothing_for_one_rank():
    assert rf.argv(1, 1) == []
    assert rf.argv(2, 3) == ["--tensor-parallel-size", "2", "--data-parallel-size", "3"]
