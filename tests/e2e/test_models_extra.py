"""The embedded tiny-reranker, tiny-embed and tiny-vlm without an engine: deterministic
bytes, weights whose names and shapes transformers accepts with nothing missing or
unexpected, tokenizers that give real ids (not all [UNK]) and the exact pair layout
vLLM's cross-encoder path relies on, and a BLIP-2 processor that works without
torchvision. Loading in vLLM (dummy and real weights) is covered by the engine tests:
tests/e2e/test_usage_e2e.py (tiny-reranker dummy, tiny-embed real) and
tests/e2e/test_mm_uuid_e2e.py (tiny-vlm real and dummy)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from opsctl.embedded import catalog

EXTRA = ("tiny-reranker", "tiny-embed", "tiny-vlm")


def digest(path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {n: catalog.build(catalog.get(n), root) for n in EXTRA}


@pytest.mark.parametrize("name", EXTRA)
def test_listed_and_byte_identical_across_builds(tmp_path, built, name) -> None:
    assert name in catalog.CATALOG
    again = catalog.build(catalog.get(name), tmp_path)
    assert digest(again) == digest(built[name])
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        digest(again)
    )


@pytest.mark.parametrize(
    ("name", "auto", "archetype"),
    [
        ("tiny-reranker", "AutoModelForSequenceClassification", "cross-encoder"),
        ("tiny-embed", "AutoModel", "bi-encoder"),
        ("tiny-vlm", "Blip2ForConditionalGeneration", "vision-language"),
    ],
)
def test_real_weights_load_completely(built, name, auto, archetype) -> None:
    import transformers

    from opsctl.engine.model import archetype_of

    path = built[name]
    cfg = json.loads((path / "config.json").read_text())
    assert archetype_of(cfg) == archetype == catalog.get(name).archetype
    _model, info = getattr(transformers, auto).from_pretrained(str(path), output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    from safetensors.numpy import load_file

    t = load_file(str(path / "model.safetensors"))
    big = [v for v in t.values() if v.ndim == 2 and min(v.shape) > 8]
    assert big and all(float(v.std()) > 0.05 for v in big)  # seeded, not constant / near-zero


def test_bert_tokenizer_pairs_like_vllm_cross_encoder(built) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built["tiny-reranker"]))
    enc = tok(text="What is the capital of France?", text_pair="Paris is the capital of France.")
    strs = tok.convert_ids_to_tokens(enc["input_ids"])
    assert strs[0] == "[CLS]" and strs.count("[SEP]") == 2 and strs[-1] == "[SEP]"
    assert "[UNK]" not in strs and "paris" in strs
    assert enc["token_type_ids"][-1] == 1 and enc["token_type_ids"][0] == 0
    # the rendering diag usage counts through /tokenize gives the very same ids
    assert (
        tok("What is the capital of France? [SEP] Paris is the capital of France.")["input_ids"]
        == enc["input_ids"]
    )
    cfg = json.loads((built["tiny-reranker"] / "config.json").read_text())
    assert cfg["num_labels"] == 1 and cfg["hidden_size"] // cfg["num_attention_heads"] >= 32


def test_blip2_processor_without_torchvision(built) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    assert importlib.util.find_spec("torchvision") is None
    path = built["tiny-vlm"]
    cfg = json.loads((path / "config.json").read_text())
    proc = AutoProcessor.from_pretrained(str(path))
    out = proc(images=Image.new("RGB", (40, 30), (200, 10, 10)), text="hello", return_tensors="np")
    assert out["pixel_values"].shape == (1, 3, 28, 28)
    ids = list(out["input_ids"][0])
    assert ids[: cfg["num_query_tokens"]] == [cfg["image_token_index"]] * cfg["num_query_tokens"]
    assert cfg["text_config"]["architectures"] == ["LlamaForCausalLM"]
    assert "chat_template" in json.loads((path / "tokenizer_config.json").read_text())
