"""``tiny-vlm-multi``: a tiny Idefics3 that takes several images in ONE prompt.

SmolVLM-style: a SigLIP-like ViT, a pixel-shuffle connector and the tiny Llama decoder.

Idefics3 runs on vLLM's CPU build without torchvision: transformers picks the PIL
backend of its image processor. Image splitting is off, so every image is resized to
IMAGE_SIZE x IMAGE_SIZE and becomes ``<fake_token_around_image><global-img>`` +
IMAGE_SEQ_LEN ``<image>`` tokens + ``<fake_token_around_image>``. The chat template is
the plain-string one: vLLM puts one ``<image>`` placeholder per image part in the text.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from opsctl.embedded import llama, tokenizer, weights

V_HIDDEN = 64
V_INTER = 128
V_HEADS = 2
V_LAYERS = 1
IMAGE_SIZE = 32
PATCH = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE_FACTOR**2  # 4 tokens per image
MAX_IMAGES = 4  # the --limit-mm-per-prompt the catalog starts it with
SPECIALS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
SEED = 86420


def idefics3_config(vocab: int, image_token_id: int) -> dict:
    """The config.json of the tiny Idefics3 model."""
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": image_token_id,
        "scale_factor": SCALE_FACTOR,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "pad_token_id": 3,
        "text_config": llama.text_config(vocab, layers=2),
        "vision_config": {
            "model_type": "idefics3_vision",
            "hidden_size": V_HIDDEN,
            "intermediate_size": V_INTER,
            "num_attention_heads": V_HEADS,
            "num_hidden_layers": V_LAYERS,
            "num_channels": 3,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
        },
    }


def vision_connector_tensors(seed: int) -> dict:
    """HF Idefics3 names of the vision tower and the connector."""
    s = weights.seeded

    def ln(name: str, t: dict) -> None:
        t[f"{name}.weight"] = weights.ones((V_HIDDEN,))
        t[f"{name}.bias"] = weights.ones((V_HIDDEN,)) * 0.0

    def lin(name: str, out_dim: int, in_dim: int, t: dict) -> None:
        t[f"{name}.weight"] = s(name, (out_dim, in_dim), 1.5 / math.sqrt(in_dim), seed)
        t[f"{name}.bias"] = s(f"{name}.bias", (out_dim,), 0.02, seed)

    e = "model.vision_model.embeddings."
    n_pos = (IMAGE_SIZE // PATCH) ** 2
    t: dict = {
        f"{e}patch_embedding.weight": s(
            "patch", (V_HIDDEN, 3, PATCH, PATCH), 1.5 / math.sqrt(3 * PATCH * PATCH), seed
        ),
        f"{e}patch_embedding.bias": s("patch.bias", (V_HIDDEN,), 0.02, seed),
        f"{e}position_embedding.weight": s("vpos", (n_pos, V_HIDDEN), 0.5, seed),
    }
    for i in range(V_LAYERS):
        v = f"model.vision_model.encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            lin(f"{v}self_attn.{proj}", V_HIDDEN, V_HIDDEN, t)
        lin(f"{v}mlp.fc1", V_INTER, V_HIDDEN, t)
        lin(f"{v}mlp.fc2", V_HIDDEN, V_INTER, t)
        ln(f"{v}layer_norm1", t)
        ln(f"{v}layer_norm2", t)
    ln("model.vision_model.post_layernorm", t)
    in_dim = V_HIDDEN * SCALE_FACTOR**2
    t["model.connector.modality_projection.proj.weight"] = s(
        "connector", (llama.HIDDEN, in_dim), 1.5 / math.sqrt(in_dim), seed
    )
    return t


def text_tensors(vocab: int, seed: int) -> dict:
    """The tiny Llama's tensors under Idefics3's names (model.text_model.*, lm_head)."""
    out = {}
    for k, v in llama.llama_tensors(vocab, 2, seed=seed).items():
        out["model.text_model." + k[len("model.") :] if k.startswith("model.") else k] = v
    return out


def _json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def build_tiny_vlm_multi(out: Path) -> None:
    """Write the ``tiny-vlm-multi`` model (Idefics3) into ``out``."""
    vocab = tokenizer.write_bpe_tokenizer(out, extra_specials=SPECIALS)
    image_id = tokenizer.token_id(out, "<image>")
    _json(out / "config.json", idefics3_config(vocab, image_id))
    _json(out / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    _json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Idefics3ImageProcessor",
            "processor_class": "Idefics3Processor",
            "do_resize": True,
            "size": {"longest_edge": IMAGE_SIZE},
            "max_image_size": {"longest_edge": IMAGE_SIZE},
            "do_image_splitting": False,
            "resample": 1,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": True,
            "do_pad": True,
        },
    )
    _json(
        out / "processor_config.json",
        {"processor_class": "Idefics3Processor", "image_seq_len": IMAGE_SEQ_LEN},
    )
    tensors = vision_connector_tensors(SEED)
    tensors.update(text_tensors(vocab, SEED))
    weights.save(out / "model.safetensors", tensors)
