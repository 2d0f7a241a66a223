"""Tiny Llama decoders: ``tiny-llama`` and ``tiny-hybrid`` (two KV cache groups).

``tiny-hybrid`` alternates sliding-window and full attention layers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from opsctl.embedded import tokenizer, weights

HIDDEN = 128
INTER = 256
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32


def text_config(vocab: int, layers: int) -> dict:
    """The config.json of a tiny Llama decoder with ``vocab`` tokens and ``layers`` layers."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
    }


def llama_tensors(vocab: int, layers: int, seed: int, prefix: str = "") -> dict:
    """Weights at a scale that gives peaked, varied logits (not near-uniform)."""
    s = weights.seeded
    t = {
        f"{prefix}model.embed_tokens.weight": s("embed", (vocab, HIDDEN), 1.0, seed),
        f"{prefix}model.norm.weight": weights.ones((HIDDEN,)),
        f"{prefix}lm_head.weight": s("lm_head", (vocab, HIDDEN), 2.0 / math.sqrt(HIDDEN), seed),
    }
    for i in range(layers):
        p = f"{prefix}model.layers.{i}."
        dims = {
            "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
            "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
            "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
            "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
            "mlp.gate_proj": (INTER, HIDDEN),
            "mlp.up_proj": (INTER, HIDDEN),
            "mlp.down_proj": (HIDDEN, INTER),
        }
        for name, shape in dims.items():
            t[f"{p}{name}.weight"] = s(f"{i}.{name}", shape, 1.5 / math.sqrt(shape[1]), seed)
        t[f"{p}input_layernorm.weight"] = weights.ones((HIDDEN,))
        t[f"{p}post_attention_layernorm.weight"] = weights.ones((HIDDEN,))
    return t


def _write(out: Path, config: dict, seed: int) -> None:
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, indent=2) + "\n"
    )
    weights.save(
        out / "model.safetensors",
        llama_tensors(config["vocab_size"], config["num_hidden_layers"], seed),
    )


def build_tiny_llama(out: Path) -> None:
    """Write the ``tiny-llama`` model into ``out``."""
    vocab = tokenizer.write_bpe_tokenizer(out)
    _write(out, text_config(vocab, layers=2), seed=1234)


def build_tiny_hybrid(out: Path) -> None:
    """Write the ``tiny-hybrid`` model (sliding-window and full attention) into ``out``."""
    vocab = tokenizer.write_bpe_tokenizer(out)
    config = text_config(vocab, layers=4)
    config["sliding_window"] = 32
    config["layer_types"] = [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ]
    _write(out, config, seed=4321)
