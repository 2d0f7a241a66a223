"""Unit tests of diag usage's decisions (opsctl.suite.usage.judge, judge_tokens): engine
inputs, the comparison over counts collected beforehand, pair templates, /tokenize
counting, model kind and refusals."""

from __future__ import annotations

import json

import pytest

from opsctl.suite.usage import judge as U
from opsctl.suite.usage import judge_tokens as T
from opsctl.suite.usage.run import TABLE_COLUMNS, table_rows


def words(x) -> int:
    """A stand-in token count: [CLS] + words + [SEP] (+ words + [SEP] for a pair)."""
    if isinstance(x, tuple):
        return 3 + len(x[0].split()) + len(x[1].split())
    return 2 + len(x.split())


def compare(kind, case, usage, count=words, *, cross=None) -> U.UsageRow:
    """The comparison as the check runs it: count every engine input first, then judge."""
    inputs = U.engine_inputs(kind, case)
    return U.compare(
        kind,
        case,
        usage,
        [count(x) for x in inputs],
        cross_parts=None if cross is None else [cross(x) for x in inputs],
    )


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
    row = compare(kind, CASE3, {"prompt_tokens": expected, "total_tokens": expected})
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
    row = compare(U.CROSS, CASE3, usage, words)
    assert row.verdict == "fail"
    assert row.note


def test_old_bi_encoder_count_over_outputs_is_caught() -> None:
    # Before vLLM's fix the bi-encoder usage summed the post-processed pair outputs
    # (query + pad + document per pair): a different number from the engine inputs.
    old = sum(words(CASE3.queries[0]) + 1 + words(d) for d in CASE3.documents)
    row = compare(U.BI, CASE3, {"prompt_tokens": old, "total_tokens": old}, words)
    assert row.verdict == "fail"


def test_findings_and_cross_check() -> None:
    good = compare(
        U.CROSS,
        CASE3,
        {"prompt_tokens": 21, "total_tokens": 21},
        words,
        cross=lambda x: words(x) + 1,
    )
    bad = compare(U.CROSS, CASE3, {"prompt_tokens": 30, "total_tokens": 30}, words)
    f = U.findings([good, bad])
    codes = [x.code for x in f]
    assert "usage.mismatch" in codes and "usage.derivations_disagree" in codes
    assert U.overall_verdict([good, bad], f) == "fail"
    only_good = U.findings(
        [compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21}, words)]
    )
    assert [x.severity for x in only_good] == ["ok"]


def test_special_affixes() -> None:
    assert T.special_affixes(["[CLS]", "a", "b", "[SEP]"], ["a", "b"]) == (["[CLS]"], ["[SEP]"])
    assert T.special_affixes(["<s>", "a"], ["a"]) == (["<s>"], [])
    with pytest.raises(ValueError):
        T.special_affixes(["x"], ["a"])


@pytest.mark.parametrize(
    ("prefix", "suffix", "specials", "name"),
    [
        (["[CLS]"], ["[SEP]"], 3, "bert"),  # [CLS] q [SEP] d [SEP]
        (["<s>"], ["</s>"], 4, "roberta"),  # <s> q </s></s> d </s> (RoBERTa, XLM-R)
    ],
)
def test_pair_templates(prefix, suffix, specials, name) -> None:
    t = T.pair_template(prefix, suffix)
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
    prefix, suffix = T.special_affixes(one, ["a", "b"])
    t = T.pair_template(prefix, suffix)
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
    bert = T.pair_template(["[CLS]"], ["[SEP]"])
    assert bert is not None and bert.count(2, 3) == len(pair) - 1


def test_unknown_template_gives_unverified_rows() -> None:
    assert T.pair_template(["<bos>"], []) is None
    assert T.pair_template([], []) is None

    def no_pairs(x):
        return None if isinstance(x, tuple) else words(x)

    row = compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21}, no_pairs)
    assert row.verdict == "unverified" and row.expected is None and "not derivable" in row.note
    f = U.findings([row])
    assert [x.code for x in f] == ["usage.unverified"] and f[0].severity == "warning"
    assert U.overall_verdict([row], f) == "unverified"
    assert table_rows([row])[0][4] == "- = -+-+-"
    bad = compare(U.CROSS, CASE3, {"prompt_tokens": 30, "total_tokens": 30}, words)
    both = [row, bad]
    assert U.overall_verdict(both, U.findings(both)) == "fail"


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
    rows = table_rows([compare(U.BI, CASE3, {"prompt_tokens": 16, "total_tokens": 16}, words)])
    assert (
        rows[0][3] == "16/16"
        and rows[0][4] == "16 = 4+3+4+5"
        and len(rows[0]) == len(TABLE_COLUMNS)
    )


def test_compare_takes_numbers_and_a_cross_check_with_a_gap_is_none() -> None:
    row = U.compare(
        U.CROSS,
        CASE3,
        {"prompt_tokens": 21, "total_tokens": 21},
        (6, 7, 8),
        cross_parts=(6, None, 8),
    )
    assert row.verdict == "pass" and row.parts == (6, 7, 8) and row.cross_check is None
    assert U.compare(U.CROSS, CASE3, None, (6, 7, 8)).note == "response has no usage.prompt_tokens"
    off = U.compare(U.CROSS, CASE3, {"prompt_tokens": 22, "total_tokens": 23}, (6, 7, 8))
    assert off.note == "prompt_tokens off by +1, total_tokens off by +2"


BERT = T.pair_template(["[CLS]"], ["[SEP]"])


def test_tokenize_requests_and_remote_parts() -> None:
    """What /tokenize must be asked, and how its lengths become each input's count."""
    inputs = U.engine_inputs(U.CROSS, CASE3)
    asked = T.tokenize_requests(inputs, BERT)
    assert asked == (("q one", False), ("a", False), ("b c", False), ("d e f", False))
    lengths = {(t, special): len(t.split()) + 2 * special for t, special in asked}
    assert T.remote_parts(inputs, lengths, BERT) == (6, 7, 8)
    # an unknown template: pairs are not derivable and nothing is asked for them
    assert T.tokenize_requests(inputs, None) == ()
    assert T.remote_parts(inputs, {}, None) == (None, None, None)
    texts = U.engine_inputs(U.BI, CASE3)
    asked = T.tokenize_requests(texts, None)
    assert asked == tuple((t, True) for t in ("q one", "a", "b c", "d e f"))
    lengths = {k: len(k[0].split()) + 2 for k in asked}
    assert T.remote_parts(texts, lengths, None) == (4, 3, 4, 5)


def test_inferred_template_and_methods() -> None:
    t = T.inferred_template(["<s>", "hello", "world", "</s>"], ["hello", "world"])
    assert t is not None and t.name.startswith("roberta")
    assert T.inferred_template(["x"], ["hello"]) is None  # not contiguous
    assert T.inferred_template(["<bos>", "a"], ["a"]) is None  # unknown family
    assert T.remote_method(U.BI, None) == "/tokenize of each text"
    assert T.remote_method(U.CROSS, None) == "/tokenize (pair template unknown)"
    assert T.remote_method(U.CROSS, t).endswith("+ " + t.name)
    assert T.local_method(U.CROSS, "/m") == "local tokenizer(text=q, text_pair=d) from /m"
    assert T.local_method(U.BI, "/m") == "local tokenizer(text) from /m"


def test_model_kind_and_refusals() -> None:
    from opsctl.errors import BadInput

    url = "http://h:1"
    assert U.declared_kind(U.BI, U.CROSS, None, None, url) == (U.BI, "--kind")
    assert U.declared_kind(None, U.CROSS, U.BI, "/r", url) == (U.CROSS, "embedded model archetype")
    assert U.declared_kind(None, None, U.BI, "/r", url) == (U.BI, "config.json under /r")
    assert U.declared_kind(None, None, None, None, url) is None
    with pytest.raises(BadInput, match="is a decoder model"):
        U.declared_kind(None, None, "decoder", "/r", url)
    assert U.kind_from_probes(True, False, url) == (U.BI, "/v1/embeddings answers")
    assert U.kind_from_probes(False, True, url) == (U.CROSS, "/classify answers")
    with pytest.raises(BadInput, match="cross- or bi-encoder"):
        U.kind_from_probes(False, False, url)
    assert U.model_refusal("tiny-reranker", U.CROSS) is None
    refusal = U.model_refusal("tiny-llama", "decoder")
    assert refusal is not None and "diag usage needs a cross-encoder" in str(refusal)
    assert U.score_refusal(200, {}, url) is None
    assert "no /score endpoint" in str(U.score_refusal(404, {}, url))
    assert "answered HTTP 500" in str(U.score_refusal(500, {"detail": "x"}, url))


def test_unk_findings_and_summary() -> None:
    assert [f.code for f in U.unk_findings(["[UNK]", "<unk>"])] == ["usage.all_unk"]
    assert U.unk_findings(["the", "[UNK]"]) == []
    good = compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21})
    unknown = compare(U.CROSS, CASE3, {}, lambda x: None)
    assert U.summary([good, unknown], "unverified") == "1/2 match, 1 unverified (not a pass)"
    assert U.summary([good], "pass") == "1/1 match"


def test_report_rows_name_token_counts_with_their_unit() -> None:
    """``diag.usage/2`` rows: every token count is a ``*_tokens`` field (docs/cli.md);
    the terminal view reads the same row back."""
    row = compare(U.CROSS, CASE3, {"prompt_tokens": 21, "total_tokens": 21})
    d = row.to_dict()
    assert (d["reported_prompt_tokens"], d["reported_total_tokens"]) == (21, 21)
    assert d["expected_tokens"] == row.expected and d["input_tokens"] == row.parts
    assert "cross_check_tokens" in d and not {"reported_prompt", "expected", "parts"} & set(d)
    assert U.UsageRow.from_dict(json.loads(json.dumps(d))) == row
