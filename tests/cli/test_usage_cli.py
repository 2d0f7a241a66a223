"""CLI tests of `opsctl diag usage` (no engine): bad input, unreachable, exit codes,
rendering, and proof the check can fail, using a stand-in HTTP server that reports
inflated usage (tests/standins/scoring.py). The check itself, called without the CLI:
tests/unit/test_checks_usage.py."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from tests.standins.diag_app import run_diag_app
from tests.standins.scoring import stand_in


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_honest_stand_in_passes() -> None:
    with stand_in(inflate=0) as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.diag.usage/2" and doc["verdict"] == "pass"
    assert doc["kind"] == "cross-encoder" and doc["kind_source"] == "/classify answers"
    assert doc["pair_separator"] == "[SEP]"
    assert len(doc["rows"]) == 8 and all(
        r["reported_prompt_tokens"] == r["expected_tokens"] for r in doc["rows"]
    )


def test_inflated_usage_is_caught() -> None:
    with stand_in(inflate=1) as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "fail"
    assert all(
        row["verdict"] == "fail" and row["reported_prompt_tokens"] == row["expected_tokens"] + 1
        for row in doc["rows"]
    )
    assert any(f["code"] == "usage.mismatch" for f in doc["findings"])
    assert "differ from the engine-input count" in r.stderr


def test_inflated_usage_rich_output() -> None:
    with stand_in(inflate=3) as url:
        r = run("diag", "usage", url)
    assert r.exit_code == 1
    assert "/rerank on cross-encoder" in r.stdout and "FAIL" in r.stdout and "off by +3" in r.stdout


def test_server_without_score_is_bad_input() -> None:
    with stand_in(score_status=404) as url:
        r = run("diag", "usage", url, "--kind", "cross-encoder")
    assert r.exit_code == 2
    assert "no /score endpoint" in r.stderr


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["not a url"], 2, "URL"),
        (["ftp://x"], 2, "http(s)"),
        (["http://127.0.0.1:9"], 3, "no server answered"),
        ([], 2, "--model"),
        (["http://127.0.0.1:9", "--model", "tiny-reranker"], 2, "not both"),
        (["--model", "tiny-llama"], 2, "decoder model"),
        (["--model", "no-such-model"], 2, "unknown embedded model"),
        (["--model", "tiny-reranker", "--kind", "llm"], 2, "--kind"),
        (["--model", "tiny-reranker", "--load-format", "gguf"], 2, "--load-format"),
    ],
)
def test_bad_input_and_unreachable(args, code, text) -> None:
    r = run("diag", "usage", *args)
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert text in r.stderr
    assert r.stdout == ""
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("opsctl: error")]) == 1


def test_tui_without_a_terminal_runs_plain() -> None:
    with stand_in() as url:
        r = run("diag", "usage", url, "--tui")
    assert r.exit_code == 0
    assert "needs a terminal" in r.stderr and "verdict: PASS" in r.stdout


def test_live_panel_shows_the_usage_table() -> None:
    """--tui feeds the check's events into the reusable DiagPanel."""
    from opsctl.checks.target import UrlTarget
    from opsctl.suite.usage import run as usage

    with stand_in(inflate=2) as url:
        last, app = run_diag_app(
            "diag usage",
            lambda progress: usage.run(UrlTarget(url), usage.Options(), progress),
            (160, 40),
            200,
        )
    assert app.error is None and app.report is not None and app.report.verdict == "fail"
    assert last["verdict"] == "fail" and len(last["rows"]) == 8
    assert all(row[5] == "FAIL" for row in last["rows"])


def test_roberta_pairs_are_counted_with_their_template() -> None:
    """<s> q </s></s> d </s>: one more special token per pair than BERT's template."""
    with stand_in(style="roberta") as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "pass" and doc["pair_template"].startswith("roberta")
    assert doc["expected_source"] == "/tokenize"
    one = doc["rows"][0]  # "What is the capital of France?" + "Paris is the capital of France."
    assert one["expected_tokens"] == 6 + 6 + 4
    # a BERT-style guess (3 specials per pair) would have been a false mismatch
    with stand_in(style="roberta", inflate=1) as url:
        assert run("diag", "usage", url, "--json").exit_code == 1


def test_unknown_pair_template_is_unverified_not_a_mismatch() -> None:
    with stand_in(style="odd") as url:
        r = run("diag", "usage", url, "--json")
    assert r.exit_code == 1, r.output  # not judged is never a pass
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "unverified" and doc["pair_template"] is None
    assert {row["verdict"] for row in doc["rows"]} == {"unverified"}
    assert all(row["expected_tokens"] is None for row in doc["rows"])
    assert any(f["code"] == "usage.unverified" for f in doc["findings"])
    assert "usage unverified (not judged, so not a pass): 8 of 8" in r.stderr
    with stand_in(style="odd") as url:
        r = run("diag", "usage", url)
    assert "UNVERIFIED" in r.stdout and "FAIL" not in r.stdout


def test_local_tokenizer_is_the_primary_count(tmp_path) -> None:
    """With the model directory readable, the model's own tokenizer(text=q, text_pair=d)
    gives the expected count (here a real RoBERTa-style template), /tokenize the
    cross-check."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted(
        {
            w
            for c in __import__("opsctl.suite.usage.judge", fromlist=["x"]).default_cases()
            for t in (*c.queries, *c.documents)
            for w in t.split()
        }
    )
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *words])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        sep_token="</s>",
        cls_token="<s>",
    )
    fast.save_pretrained(tmp_path)
    assert len(fast(text="a b", text_pair="c")["input_ids"]) == 3 + 4
    with stand_in(style="roberta", root=str(tmp_path)) as url:
        r = run("diag", "usage", url, "--kind", "cross-encoder", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["expected_source"] == "local tokenizer" and doc["local_cross_check"] is True
    assert doc["verdict"] == "pass"
    assert all(row["cross_check_tokens"] == row["expected_tokens"] for row in doc["rows"])


def test_timeout_exits_4() -> None:
    with stand_in(sleep=3.0) as url:
        t0 = time.monotonic()
        r = run("diag", "usage", url, "--timeout", "0.5", "--json")
    assert r.exit_code == 4, (r.stdout, r.stderr)
    assert "no answer within 0.5 s" in r.stderr
    doc = json.loads(r.stdout)  # --json: a document whatever happened (issue 23)
    assert (doc["schema"], doc["state"], doc["exit_code"]) == ("opsctl.error/1", "timeout", 4)
    assert time.monotonic() - t0 < 10


def test_generative_model_by_url_is_bad_input(tmp_path) -> None:
    """A server whose model directory is readable and generative: exit 2, clear message;
    one with no /score, /classify or /v1/embeddings: exit 2 too."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with stand_in(root=str(tmp_path), generative=True) as url:
        r = run("diag", "usage", url)
    assert r.exit_code == 2 and "is a decoder model" in r.stderr and r.stdout == ""
    with stand_in(generative=True) as url:
        r = run("diag", "usage", url)
    assert r.exit_code == 2 and "cross- or bi-encoder" in r.stderr


def test_generative_model_by_name_fails_before_any_engine_start(monkeypatch) -> None:
    from opsctl.engine import server

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("an engine was started")

    monkeypatch.setattr(server.EngineServer, "start", boom)
    for name in ("tiny-llama", "tiny-vlm"):
        r = run("diag", "usage", "--model", name)
        assert r.exit_code == 2, r.output
        assert "diag usage needs a cross-encoder or a bi-encoder" in r.stderr
