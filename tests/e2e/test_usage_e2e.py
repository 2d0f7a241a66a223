"""`opsctl diag usage` against real vLLM CPU engines. Two engine starts in this module:

- tiny-reranker (cross-encoder) started by the command itself (``--model``), with
  ``--load-format dummy``: every /score and /rerank usage must equal the sum of the
  (query, document) pairs tokenized together, which is also recomputed here with the
  model's own tokenizer exactly as vLLM calls it;
- tiny-embed (bi-encoder, real seeded weights) from the session pool (``tiny-embed``,
  tests/engine_pool.py: the tests only read from it), checked by URL
  (through the CLI and as a library call, opsctl.suite.usage.run.run): usage must equal
  every text once (query once + documents), and the embeddings are the real,
  non-constant ones.
"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from opsctl.embedded import catalog
from opsctl.suite.usage import judge as U
from opsctl.suite.usage import run as usage
from tests.opsctl_run import opsctl_json

pytestmark = [pytest.mark.engine, pytest.mark.pool("tiny-embed")]


def local_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(catalog.ensure(name)))


@pytest.fixture(scope="module")
def reranker_report() -> dict:
    return opsctl_json(
        "diag",
        "usage",
        "--model",
        "tiny-reranker",
        "--load-format",
        "dummy",
        "--json",
        timeout=900,
    )


@pytest.fixture(scope="module")
def embed_engine(engine_pool):
    return engine_pool.engine("tiny-embed")


def test_cross_encoder_usage_matches_pair_inputs(reranker_report) -> None:
    doc = reranker_report
    assert doc["schema"] == "opsctl.diag.usage/2" and doc["verdict"] == "pass"
    assert doc["kind"] == "cross-encoder" and doc["engine_started"] is True
    assert doc["pair_separator"] == "[SEP]" and doc["local_cross_check"] is True
    # the model's own tokenizer is the expected count; /tokenize + BERT template the check
    assert doc["expected_source"] == "local tokenizer" and doc["pair_template"].startswith("bert")
    rows = doc["rows"]
    assert {r["endpoint"] for r in rows} == {"/score", "/rerank"} and len(rows) == len(
        U.default_cases()
    )
    tok = local_tokenizer("tiny-reranker")
    for case, row in zip(U.default_cases(), rows, strict=True):
        pairs = U.engine_inputs(U.CROSS, case)
        exact = [len(tok(text=q, text_pair=d)["input_ids"]) for q, d in pairs]
        assert row["input_tokens"] == exact, row  # one input per document: query + document
        assert row["reported_prompt_tokens"] == row["reported_total_tokens"] == sum(exact)
        assert row["cross_check_tokens"] == sum(exact)
    top = next(r for r in rows if r["top_n"])
    assert top["results"] == 1 and top["documents"] == 3  # usage counts all 3 processed pairs
    # the engine really ran with dummy weights, started by the command
    meta = json.loads((__import__("pathlib").Path(doc["run_dir"]) / "meta.json").read_text())
    assert meta["load_format"] == "dummy" and meta.get("stopped_at")


def test_bi_encoder_usage_counts_each_text_once(embed_engine) -> None:
    r = CliRunner().invoke(app, ["diag", "usage", embed_engine.url, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (
        doc["kind"] == "bi-encoder" and doc["verdict"] == "pass" and doc["engine_started"] is False
    )
    tok = local_tokenizer("tiny-embed")
    for case, row in zip(U.default_cases(), doc["rows"], strict=True):
        texts = U.engine_inputs(U.BI, case)
        assert len(texts) == len(case.queries) + len(case.documents)
        exact = [len(tok(t)["input_ids"]) for t in texts]
        assert row["input_tokens"] == exact
        assert row["reported_prompt_tokens"] == row["reported_total_tokens"] == sum(exact)
        # the pre-fix count (query + pad + document per output pair) would differ
        q = exact[: len(case.queries)] * (len(case.documents) if len(case.queries) == 1 else 1)
        old = sum(a + 1 + b for a, b in zip(q, exact[len(case.queries) :], strict=True))
        assert old != row["reported_prompt_tokens"]


def test_bi_encoder_tokenize_and_real_embeddings(embed_engine) -> None:
    with httpx.Client(base_url=embed_engine.url, timeout=60) as c:
        t = c.post(
            "/tokenize",
            json={
                "model": "tiny-embed",
                "prompt": "Paris is the capital of France.",
                "return_token_strs": True,
            },
        ).json()
        assert t["token_strs"][0] == "[CLS]" and t["token_strs"][-1] == "[SEP]"
        assert "[UNK]" not in t["token_strs"] and "paris" in t["token_strs"]
        e = c.post(
            "/v1/embeddings", json={"model": "tiny-embed", "input": ["Paris", "the cat sat."]}
        ).json()
    a, b = (d["embedding"] for d in e["data"])
    assert len(a) == 128 and a != b and len({round(x, 6) for x in a}) > 64


def test_human_output_has_a_table_per_endpoint(embed_engine) -> None:
    r = CliRunner().invoke(app, ["diag", "usage", embed_engine.url])
    assert r.exit_code == 0, r.output
    assert "/score on bi-encoder" in r.stdout and "/rerank on bi-encoder" in r.stdout
    assert "verdict: PASS" in r.stdout


def test_library_call_on_the_running_engine(embed_engine) -> None:
    """The check as a plain call: the same verdict and rows as the CLI, one CaseResult
    event per request."""
    seen: list[ev.Event] = []
    report = usage.run(UrlTarget(embed_engine.url), usage.Options(), seen.append)
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["kind"] == "bi-encoder"
    assert doc["expected_source"] == "local tokenizer" and doc["local_cross_check"] is True
    results = [e for e in seen if isinstance(e, ev.CaseResult)]
    assert [r.verdict for r in results] == ["pass"] * len(U.default_cases())
    assert isinstance(seen[-1], ev.Finished) and seen[-1].verdict == "pass"
