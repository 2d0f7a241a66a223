"""Unit tests of diag usage's comparison logic (opsctl.domain.usage)."""

from __future__ import annotations

import pytest

from opsctl.domain import usage as U


def words(x) -> int:
    """A stand-in token count: [CLS] + words + [SEP] (+ words + [SEP] for a pair)."""
    if isinstance(x, tuple):
        return 3 + len(x[0].split()) + len(x[1].split())
    return 2 + len(x.split())


CASE3 = U.UsageCase("three", "rerank", ("q one",), ("a", "b c", "d e f"))
PAIRS = U.UsageCase("pairs", "score", ("q1", "q2 x"), ("d1", "d2 y"))


def test_cross_encoder_inputs_pair_the_query_with_every_document() -> None:
    assert U.engine_inputs(U.CROSS, CASE3) == [("q one", "a"), ("q one", "b c"), ("q one", "d e f")]
    assert U.engine_inputs(U.CROSS, PAIRS) == [("q1", "d1"), ("q2 x", "d2 y")]


def test_bi_encoder_inputs_count_each_text_once() -> None:
    assert U.engine_inputs(U.BI, CASE3) == ["q one", "a", "b c", "d e f"]
    assert U.engine_inputs(U.BI, PAIRS) == ["q1", "q2 x", "d1", "d2 y"]


def test_mismatched_pairs_and_unknown_kind_raise() -> None:
    with pytest.raises(ValueError):
        U.engine_inputs(U.CROSS, U.UsageCase("bad", "score", ("a", "b"), ("c",)))
    with pytest.raises(ValueError):
        U.engine_inputs("decoder", CASE3)


@pytest.mark.parametrize(
    ("kind", "expected", "parts"),
    [(U.CROSS, 6 + 7 + 8, (6, 7, 8)), (U.BI, 4 + 3 + 4 + 5, (4, 3, 4, 5))],
)
def test_compare_passes_on_exact_usage(kind, expected, parts) -> None:
    row = U.compare(kind, CASE3, {"prompt_tokens": expected, "total_tokens": expected}, words)
    assert (row.verdict, row.expected, row.parts) == ("pass", expected, parts)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 22, "total_tokens": 22},  # one too many (old bi-encoder bug shape)
        {"prompt_tokens": 20, "total_tokens": 20},  # one too few
        {"prompt_tokens": 21, "total_tokens": 25},  # total differs
        {"prompt_tokens": "21", "total_tokens": 21},  # not an integer
        {},  # missing
        None,
    ],
)
def test_compare_fails_on_any_difference(usage) -> None:
    row = U.compare(U.CROSS, CASE3, usage, words)
    assert row.verdict == "fail"
    assert row.note


def test_old_bi_encoder_count_over_outputs_is_caught() -> None:
    # Before vLLM's fix the bi-encoder usage summed the post-processed pair outputs
    # (query + pad + document per pair): a different number from the engine inputs.
    old = sum(words(CASE3.queries[0]) + 1 + words(d) for d in CASE3.documents)
    row = U.compare(U.BI, CASE3, {"prompt_tokens": old, "total_tokens": old}, words)
    assert row.verdict == "fail"


def test_findings_and_cross_check() -> None:
    good = U.compare(
        U.CROSS,
        CASE3,
        {"prompt_tokens": 21, "total_tokens": 21},
        words,
        cross_count=lambda x: words(x) + 1,
    )
    bad = U.compare(U.CROSS, CASE3, {"prompt_tokens": 30, "total_tokens": 30}, words)
    f = U.findings([good, bad])
    codes = [x.code for x in f]
    assert "usage.mismatch" in codes and "usage.derivations_disagree" in codes
    assert U.UsageReport(U.CROSS, "m", "u", (good, bad), tuple(f)).verdict == "fail"
    only_good = U.findings(
        [U.compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21}, words)]
    )
    assert [x.severity for x in only_good] == ["ok"]


def test_special_affixes() -> None:
    assert U.special_affixes(["[CLS]", "a", "b", "[SEP]"], ["a", "b"]) == (["[CLS]"], ["[SEP]"])
    assert U.special_affixes(["<s>", "a"], ["a"]) == (["<s>"], [])
    with pytest.raises(ValueError):
        U.special_affixes(["x"], ["a"])


@pytest.mark.parametrize(
    ("prefix", "suffix", "specials", "name"),
    [
        (["[CLS]"], ["[SEP]"], 3, "bert"),  # [CLS] q [SEP] d [SEP]
        (["<s>"], ["</s>"], 4, "roberta"),  # <s> q </s></s> d </s> (RoBERTa, XLM-R)
    ],
)
def test_pair_templates(prefix, suffix, specials, name) -> None:
    t = U.pair_template(prefix, suffix)
    assert t is not None and t.name.startswith(name) and t.specials == specials
    assert t.count(5, 7) == 5 + 7 + specials


def test_roberta_template_matches_a_real_roberta_tokenizer() -> None:
    """The template's count equals tokenizer(text=q, text_pair=d) of a RoBERTa-style
    post-processor (what vLLM's scoring io_processor calls)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "a", "b", "c"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>")
    one = tok.convert_ids_to_tokens(tok("a b")["input_ids"])
    prefix, suffix = U.special_affixes(one, ["a", "b"])
    t = U.pair_template(prefix, suffix)
    assert t is not None
    pair = tok(text="a b", text_pair="c a b")["input_ids"]
    assert tok.convert_ids_to_tokens(pair) == [
        "<s>",
        "a",
        "b",
        "</s>",
        "</s>",
        "c",
        "a",
        "b",
        "</s>",
    ]
    assert t.count(2, 3) == len(pair)
    # the BERT template would have under-counted by one per pair
    bert = U.pair_template(["[CLS]"], ["[SEP]"])
    assert bert is not None and bert.count(2, 3) == len(pair) - 1


def test_unknown_template_gives_unverified_rows() -> None:
    assert U.pair_template(["<bos>"], []) is None
    assert U.pair_template([], []) is None

    def no_pairs(x):
        return None if isinstance(x, tuple) else words(x)

    row = U.compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21}, no_pairs)
    assert row.verdict == "unverified" and row.expected is None and "not derivable" in row.note
    f = U.findings([row])
    assert [x.code for x in f] == ["usage.unverified"] and f[0].severity == "warning"
    assert U.UsageReport(U.CROSS, "m", "u", (row,), tuple(f)).verdict == "unverified"
    assert U.table_rows([row])[0][4] == "- = -+-+-"
    bad = U.compare(U.CROSS, CASE3, {"prompt_tokens": 30, "total_tokens": 30}, words)
    both = [row, bad]
    assert U.UsageReport(U.CROSS, "m", "u", tuple(both), tuple(U.findings(both))).verdict == "fail"


def test_request_bodies() -> None:
    cases = U.default_cases()
    assert {c.endpoint for c in cases} == {"score", "rerank"}
    assert any(c.top_n for c in cases) and any(len(c.queries) > 1 for c in cases)
    body = U.UsageCase("t", "rerank", ("q",), ("a", "b"), top_n=1).body("m")
    assert body == {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}
    assert U.UsageCase("t", "score", ("q",), ("a",)).body("m") == {
        "model": "m",
        "text_1": "q",
        "text_2": "a",
    }
    rows = U.table_rows([U.compare(U.BI, CASE3, {"prompt_tokens": 16, "total_tokens": 16}, words)])
    assert (
        rows[0][3] == "16/16"
        and rows[0][4] == "16 = 4+3+4+5"
        and len(rows[0]) == len(U.TABLE_COLUMNS)
    )
