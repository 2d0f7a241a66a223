"""The embedded LoRA adapters: PEFT files with deterministic bytes, built atomically with
a marker like the models, readable by vLLM 0.32's own PEFTHelper and LoRA loader, and
different from each other."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from opsctl.embedded import lora
from opsctl.errors import BadInput

MODELS = sorted(lora.ADAPTERS)


def digests(path: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((path / name).read_bytes()).hexdigest()
        for name in (lora.CONFIG_FILE, lora.WEIGHTS_FILE)
    }


@pytest.mark.parametrize("model", MODELS)
def test_building_twice_gives_identical_bytes(model, tmp_path) -> None:
    first = lora.ensure(model, tmp_path / "a")
    second = lora.ensure(model, tmp_path / "b")
    assert sorted(first) == [s.name for s in lora.adapters_for(model)]
    for name in first:
        assert digests(first[name]) == digests(second[name])
    # and adapters of one model are different adapters
    assert len({digests(p)[lora.WEIGHTS_FILE] for p in first.values()}) == len(first)


def test_at_least_two_adapters_per_model_and_vlms_target_the_tower() -> None:
    assert MODELS == ["tiny-llama", "tiny-vlm", "tiny-vlm-multi"]
    for model in MODELS:
        specs = lora.adapters_for(model)
        assert len(specs) >= 2
        assert sum(lora.LANGUAGE in s.parts for s in specs) >= 2
    for model in ("tiny-vlm", "tiny-vlm-multi"):
        assert any(
            s.parts == (lora.TOWER,) or lora.LANGUAGE not in s.parts for s in lora.ADAPTERS[model]
        )
    assert lora.CONNECTOR in lora.MODULES["tiny-vlm-multi"]
    # BLIP-2's connector (Q-Former, language projection) is plain torch.nn.Linear in
    # vLLM 0.32, and its vision qkv cannot be wrapped: no adapter targets them
    assert lora.CONNECTOR not in lora.MODULES["tiny-vlm"]
    assert not any(n.endswith(".qkv") for n in lora.MODULES["tiny-vlm"][lora.TOWER])


def test_files_are_peft_format(tmp_path) -> None:
    path = lora.ensure("tiny-vlm-multi", tmp_path)["vision"]
    config = json.loads((path / lora.CONFIG_FILE).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == lora.RANK
    assert all("text_model" not in m for m in config["target_modules"])
    from safetensors.numpy import load_file

    tensors = load_file(str(path / lora.WEIGHTS_FILE))
    name = "base_model.model.model.connector.modality_projection.proj"
    assert tensors[f"{name}.lora_A.weight"].shape == (lora.RANK, 256)
    assert tensors[f"{name}.lora_B.weight"].shape == (128, lora.RANK)
    assert len(tensors) == 2 * len(config["target_modules"])


def test_vllm_reads_the_config_and_loads_the_weights(tmp_path) -> None:
    """vLLM 0.32's own code: PEFTHelper (the config checks it applies at load time) and
    LoRAModel.from_local_checkpoint (the weights, against the modules vLLM expects)."""
    from vllm.config.lora import LoRAConfig
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    for model, name in (("tiny-llama", "beta"), ("tiny-vlm-multi", "alpha")):
        path = lora.ensure(model, tmp_path)[name]
        helper = PEFTHelper.from_local_dir(str(path), max_position_embeddings=512)
        helper.validate_legal(LoRAConfig(max_lora_rank=8, max_loras=2))
        assert helper.r == lora.RANK and helper.vllm_lora_scaling_factor == lora.ALPHA / lora.RANK
        targets = lora.targets(model, lora.ADAPTERS[model][0 if name == "alpha" else 1])
        expected = {m.rsplit(".", 1)[-1] for m in targets}
        loaded = LoRAModel.from_local_checkpoint(
            str(path), expected, helper, lora_model_id=1, device="cpu"
        )
        assert set(loaded.loras) == set(targets)
        some = next(iter(targets))
        out_dim, in_dim = targets[some]
        assert tuple(loaded.loras[some].lora_a.shape) == (lora.RANK, in_dim)
        assert tuple(loaded.loras[some].lora_b.shape) == (out_dim, lora.RANK)


def test_marker_and_atomic_rebuild(tmp_path) -> None:
    spec = lora.adapters_for("tiny-llama")[0]
    path = lora.build("tiny-llama", spec, tmp_path)
    assert lora.is_built("tiny-llama", spec, tmp_path) and lora.built_by_opsctl(path)
    (path / lora.WEIGHTS_FILE).write_bytes(b"garbage")
    assert lora.build("tiny-llama", spec, tmp_path) == path  # marker says built: kept
    rebuilt = lora.build("tiny-llama", spec, tmp_path, force=True)
    assert digests(rebuilt) == digests(lora.build("tiny-llama", spec, tmp_path / "x"))
    assert [p.name for p in path.parent.iterdir()] == [spec.name]  # no temporary left


def test_refuses_to_replace_what_opsctl_did_not_build(tmp_path) -> None:
    spec = lora.adapters_for("tiny-llama")[1]
    foreign = lora.adapter_path("tiny-llama", spec.name, tmp_path)
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(BadInput, match="not built by opsctl"):
        lora.build("tiny-llama", spec, tmp_path)
    assert (foreign / "keep.txt").read_text() == "mine"


def test_default_root_is_under_opsctl_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path))
    paths = lora.ensure("tiny-llama")
    assert paths["alpha"] == tmp_path / "adapters" / "tiny-llama" / "alpha"
    assert (paths["alpha"] / lora.MARKER).is_file()


def test_unknown_model_is_bad_input() -> None:
    with pytest.raises(BadInput, match="no embedded LoRA adapters"):
        lora.adapters_for("tiny-reranker")
