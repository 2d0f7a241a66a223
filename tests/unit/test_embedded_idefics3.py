"""The embedded tiny-vlm-multi (Idefics3) without an engine: deterministic bytes, weight
names vLLM's Idefics3 loads, and an HF processor (PIL backend, no torchvision) that expands
several images in ONE prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.embedded import catalog, idefics3


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tvm") / "a"
    idefics3.build_tiny_vlm_multi(out)
    return out


def test_registered_and_deterministic(built: Path, tmp_path: Path) -> None:
    spec = catalog.get("tiny-vlm-multi")
    assert spec.archetype == "vision-language"
    assert spec.images_per_prompt == idefics3.MAX_IMAGES > 1
    assert catalog.get("tiny-vlm").images_per_prompt == 1  # BLIP-2: one image per prompt
    idefics3.build_tiny_vlm_multi(tmp_path)
    for f in ("model.safetensors", "config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (tmp_path / f).read_bytes() == (built / f).read_bytes(), f


def test_config_and_weight_names(built: Path) -> None:
    from safetensors.numpy import load_file

    cfg = json.loads((built / "config.json").read_text())
    assert cfg["architectures"] == ["Idefics3ForConditionalGeneration"]
    t = load_file(str(built / "model.safetensors"))
    assert "model.text_model.embed_tokens.weight" in t and "lm_head.weight" in t
    assert "model.vision_model.encoder.layers.0.self_attn.q_proj.weight" in t
    v = cfg["vision_config"]
    assert t["model.vision_model.embeddings.position_embedding.weight"].shape == (
        (v["image_size"] // v["patch_size"]) ** 2,
        v["hidden_size"],
    )
    assert t["model.connector.modality_projection.proj.weight"].shape == (
        cfg["text_config"]["hidden_size"],
        v["hidden_size"] * cfg["scale_factor"] ** 2,
    )


def test_processor_takes_several_images(built: Path) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    p = AutoProcessor.from_pretrained(str(built))
    assert p.image_token_id == json.loads((built / "config.json").read_text())["image_token_id"]
    images = [Image.new("RGB", (28, 28), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    r = p(text=["<image><image><image> hi"], images=[images], return_tensors="np")
    assert r["pixel_values"].shape == (1, 3, 3, idefics3.IMAGE_SIZE, idefics3.IMAGE_SIZE)
    ids = list(r["input_ids"][0])
    assert ids.count(p.image_token_id) == 3 * idefics3.IMAGE_SEQ_LEN
