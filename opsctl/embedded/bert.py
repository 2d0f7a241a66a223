"""Tiny BERT encoders: ``tiny-reranker`` (cross-encoder) and ``tiny-embed`` (bi-encoder).

``tiny-reranker`` is a BertForSequenceClassification with one label: /score and /rerank score a
(query, document) pair as one input. ``tiny-embed`` is a BertModel: /score and /rerank embed
each text once and compare with cosine similarity.

The tokenizer is written directly as tokenizer.json (WordPiece, BERT normaliser and
pre-tokenizer, ``[CLS] A [SEP] B [SEP]`` post-processor with token type ids):
transformers 5 ignores ``BertTokenizerFast(vocab_file=...)`` and would give all
``[UNK]``, so nothing here goes through a transformers tokenizer constructor.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from opsctl.embedded import weights
from opsctl.embedded.tokenizer import CORPUS

HIDDEN = 128
INTER = 256
HEADS = 4  # head_dim 32: vLLM's CPU attention needs >= 32
LAYERS = 2
MAX_POS = 512
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# A few more sentences so typical query/document texts split into words, not pieces.
EXTRA_CORPUS = [
    "What is the capital of France? Paris is the capital and largest city of France.",
    "Berlin is the capital of Germany. Rome is the capital of Italy.",
    "How do I reset my password? Open the settings page and choose a new password.",
    "Token usage counts the prompt tokens the engine processed for every request.",
    "A reranker scores each document against the query; an embedding model compares vectors.",
    # the long document of `opsctl diag usage` (opsctl.suite.usage.judge.LONG_DOC), so that it
    # tokenizes into words and stays well inside max_model_len as a (query, document) pair
    "Operators of large deployments run many replicas behind a proxy. Each replica serves a "
    "reranker that scores documents against a query, and the proxy bills every request by the "
    "prompt tokens the engine reports. When the reported usage drifts from what the engine "
    "really processed, invoices and rate limits drift with it, so the count must come from the "
    "exact inputs the engine received: the query and the document joined for a cross encoder, "
    "every text once for an embedding model. This long document exists to make that "
    "difference visible.",
]


def wordpiece_vocab(texts: list[str], pre_tokenize) -> dict[str, int]:
    """A deterministic WordPiece vocabulary: specials, characters, then corpus words.

    Every character alone and as a ``##`` continuation; corpus words by frequency, ties
    alphabetical (``tokenizers``' WordPieceTrainer breaks ties differently from run to run)."""
    from collections import Counter

    words: Counter[str] = Counter()
    for text in texts:
        words.update(w for w, _ in pre_tokenize(text.lower()))
    chars = sorted({c for w in words for c in w})
    vocab = list(SPECIALS) + chars + [f"##{c}" for c in chars]
    vocab += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if w not in vocab]
    return {t: i for i, t in enumerate(vocab)}


def write_wordpiece_tokenizer(out: Path) -> int:
    """Write a lower-casing WordPiece tokenizer for the fixed corpus; returns vocab size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = pre_tokenizers.BertPreTokenizer()
    vocab = wordpiece_vocab(CORPUS + EXTRA_CORPUS, pre.pre_tokenize_str)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        lowercase=True, clean_text=True, handle_chinese_chars=True
    )
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(SPECIALS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab()
    (out / "vocab.txt").write_text(
        "".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]))
    )
    config = {
        "tokenizer_class": "BertTokenizerFast",
        "do_lower_case": True,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
        "model_max_length": MAX_POS,
        "clean_up_tokenization_spaces": True,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                k: config[k]
                for k in ("cls_token", "sep_token", "pad_token", "unk_token", "mask_token")
            },
            indent=2,
        )
        + "\n"
    )
    return tok.get_vocab_size()


def bert_config(vocab: int, architecture: str) -> dict:
    """The config.json of a tiny BERT with ``vocab`` tokens and ``architecture``."""
    config = {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTER,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": MAX_POS,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
    }
    if architecture == "BertForSequenceClassification":
        config.update({"num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}})
    return config


def bert_tensors(vocab: int, seed: int, prefix: str) -> dict:
    """HF BERT weight names (``prefix`` is "bert." inside a classifier, "" for BertModel)."""
    s = weights.seeded

    def z(shape: tuple[int, ...]):
        return weights.ones(shape) * 0.0

    p = prefix
    t = {
        f"{p}embeddings.word_embeddings.weight": s("word", (vocab, HIDDEN), 1.0, seed),
        f"{p}embeddings.position_embeddings.weight": s("pos", (MAX_POS, HIDDEN), 0.5, seed),
        f"{p}embeddings.token_type_embeddings.weight": s("type", (2, HIDDEN), 0.5, seed),
        f"{p}embeddings.LayerNorm.weight": weights.ones((HIDDEN,)),
        f"{p}embeddings.LayerNorm.bias": z((HIDDEN,)),
        f"{p}pooler.dense.weight": s("pooler", (HIDDEN, HIDDEN), 1.0 / math.sqrt(HIDDEN), seed),
        f"{p}pooler.dense.bias": z((HIDDEN,)),
    }
    for i in range(LAYERS):
        lp = f"{p}encoder.layer.{i}."
        dims = {
            "attention.self.query": (HIDDEN, HIDDEN),
            "attention.self.key": (HIDDEN, HIDDEN),
            "attention.self.value": (HIDDEN, HIDDEN),
            "attention.output.dense": (HIDDEN, HIDDEN),
            "intermediate.dense": (INTER, HIDDEN),
            "output.dense": (HIDDEN, INTER),
        }
        for name, shape in dims.items():
            t[f"{lp}{name}.weight"] = s(f"{i}.{name}", shape, 1.5 / math.sqrt(shape[1]), seed)
            t[f"{lp}{name}.bias"] = s(f"{i}.{name}.bias", (shape[0],), 0.02, seed)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[f"{lp}{ln}.weight"] = weights.ones((HIDDEN,))
            t[f"{lp}{ln}.bias"] = z((HIDDEN,))
    return t


def _build(out: Path, architecture: str, seed: int) -> None:
    vocab = write_wordpiece_tokenizer(out)
    (out / "config.json").write_text(json.dumps(bert_config(vocab, architecture), indent=2) + "\n")
    prefix = "bert." if architecture == "BertForSequenceClassification" else ""
    tensors = bert_tensors(vocab, seed, prefix)
    if architecture == "BertForSequenceClassification":
        tensors["classifier.weight"] = weights.seeded(
            "classifier", (1, HIDDEN), 1.0 / math.sqrt(HIDDEN), seed
        )
        tensors["classifier.bias"] = weights.ones((1,)) * 0.0
    weights.save(out / "model.safetensors", tensors)


def build_tiny_reranker(out: Path) -> None:
    """Write the ``tiny-reranker`` model (BertForSequenceClassification) into ``out``."""
    _build(out, "BertForSequenceClassification", seed=2468)


def build_tiny_embed(out: Path) -> None:
    """Write the ``tiny-embed`` model (BertModel) into ``out``."""
    _build(out, "BertModel", seed=1357)
