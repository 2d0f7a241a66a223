"""`tiny-vlm`: a tiny BLIP-2 (vision tower + Q-Former + the tiny Llama decoder).

BLIP-2 is the vision-language model vLLM's CPU build runs without torchvision: its
HF image processor (BlipImageProcessor) needs only PIL/numpy. One image per prompt
(vLLM's BLIP-2 limit); the processor inserts ``num_query_tokens`` ``<image>`` tokens at
the start of the prompt, so the chat template needs no image placeholder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from opsctl.embedded import llama, tokenizer, weights

V_HIDDEN = 64
V_INTER = 128
V_HEADS = 2
IMAGE_SIZE = 28
PATCH = 14
Q_HIDDEN = 64
Q_INTER = 128
NUM_QUERY_TOKENS = 4
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def blip2_config(vocab: int, image_token_id: int) -> dict:
    """The config.json of the tiny BLIP-2 vision-language model."""
    text = llama.text_config(vocab, layers=2)
    return {
        "architectures": ["Blip2ForConditionalGeneration"],
        "model_type": "blip-2",
        "num_query_tokens": NUM_QUERY_TOKENS,
        "image_token_index": image_token_id,
        "use_decoder_only_language_model": True,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": {
            "model_type": "blip_2_vision_model",
            "hidden_size": V_HIDDEN,
            "intermediate_size": V_INTER,
            "num_attention_heads": V_HEADS,
            "num_hidden_layers": 1,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH,
            "qkv_bias": True,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-6,
        },
        "qformer_config": {
            "model_type": "blip_2_qformer",
            "hidden_size": Q_HIDDEN,
            "intermediate_size": Q_INTER,
            "num_attention_heads": V_HEADS,
            "num_hidden_layers": 1,
            "encoder_hidden_size": V_HIDDEN,
            "cross_attention_frequency": 1,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-12,
            "vocab_size": vocab,
        },
    }


def vision_qformer_tensors(seed: int) -> dict:
    """HF BLIP-2 names of everything outside the language model."""
    s = weights.seeded

    def ln(name: str, dim: int, t: dict) -> None:
        t[f"{name}.weight"] = weights.ones((dim,))
        t[f"{name}.bias"] = weights.ones((dim,)) * 0.0

    def lin(name: str, out_dim: int, in_dim: int, t: dict) -> None:
        t[f"{name}.weight"] = s(name, (out_dim, in_dim), 1.5 / math.sqrt(in_dim), seed)
        t[f"{name}.bias"] = s(f"{name}.bias", (out_dim,), 0.02, seed)

    n_pos = (IMAGE_SIZE // PATCH) ** 2 + 1
    t: dict = {
        "query_tokens": s("query_tokens", (1, NUM_QUERY_TOKENS, Q_HIDDEN), 1.0, seed),
        "vision_model.embeddings.class_embedding": s("cls", (1, 1, V_HIDDEN), 1.0, seed),
        "vision_model.embeddings.position_embedding": s("vpos", (1, n_pos, V_HIDDEN), 0.5, seed),
        "vision_model.embeddings.patch_embedding.weight": s(
            "patch", (V_HIDDEN, 3, PATCH, PATCH), 1.5 / math.sqrt(3 * PATCH * PATCH), seed
        ),
        "vision_model.embeddings.patch_embedding.bias": s("patch.bias", (V_HIDDEN,), 0.02, seed),
    }
    v = "vision_model.encoder.layers.0."
    lin(f"{v}self_attn.qkv", 3 * V_HIDDEN, V_HIDDEN, t)
    lin(f"{v}self_attn.projection", V_HIDDEN, V_HIDDEN, t)
    lin(f"{v}mlp.fc1", V_INTER, V_HIDDEN, t)
    lin(f"{v}mlp.fc2", V_HIDDEN, V_INTER, t)
    ln(f"{v}layer_norm1", V_HIDDEN, t)
    ln(f"{v}layer_norm2", V_HIDDEN, t)
    ln("vision_model.post_layernorm", V_HIDDEN, t)
    ln("qformer.layernorm", Q_HIDDEN, t)
    q = "qformer.encoder.layer.0."
    for block, kv_dim in (("attention", Q_HIDDEN), ("crossattention", V_HIDDEN)):
        lin(f"{q}{block}.attention.query", Q_HIDDEN, Q_HIDDEN, t)
        lin(f"{q}{block}.attention.key", Q_HIDDEN, kv_dim, t)
        lin(f"{q}{block}.attention.value", Q_HIDDEN, kv_dim, t)
        lin(f"{q}{block}.output.dense", Q_HIDDEN, Q_HIDDEN, t)
        ln(f"{q}{block}.output.LayerNorm", Q_HIDDEN, t)
    lin(f"{q}intermediate_query.dense", Q_INTER, Q_HIDDEN, t)
    lin(f"{q}output_query.dense", Q_HIDDEN, Q_INTER, t)
    ln(f"{q}output_query.LayerNorm", Q_HIDDEN, t)
    lin("language_projection", llama.HIDDEN, Q_HIDDEN, t)
    return t


def build_tiny_vlm(out: Path) -> None:
    """Write the ``tiny-vlm`` model (BLIP-2) into ``out``."""
    vocab = tokenizer.write_bpe_tokenizer(out, extra_specials=["<image>"])
    image_id = tokenizer.token_id(out, "<image>")
    config = blip2_config(vocab, image_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, indent=2) + "\n"
    )
    (out / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "BlipImageProcessor",
                "processor_class": "Blip2Processor",
                "do_resize": True,
                "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                "resample": 3,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": CLIP_MEAN,
                "image_std": CLIP_STD,
                "do_convert_rgb": True,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "processor_config.json").write_text(
        json.dumps(
            {"processor_class": "Blip2Processor", "num_query_tokens": NUM_QUERY_TOKENS}, indent=2
        )
        + "\n"
    )
    tensors = vision_qformer_tensors(seed=97531)
    tensors.update(llama.llama_tensors(vocab, 2, seed=97531, prefix="language_model."))
    weights.save(out / "model.safetensors", tensors)
