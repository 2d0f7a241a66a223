import hashlib
import json

import pytest

from opsctl.embedded import catalog
from opsctl.errors import BadInput

BASE_MODELS = ("tiny-llama", "tiny-hybrid")


def digest(path):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.is_file()
    }


@pytest.mark.parametrize("name", BASE_MODELS)
def test_build_is_byte_identical_across_builds(tmp_path, name):
    a = catalog.build(catalog.get(name), tmp_path / "a")
    b = catalog.build(catalog.get(name), tmp_path / "b")
    da, db = digest(a), digest(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        da
    )
    assert da == db


def test_tiny_hybrid_alternates_sliding_and_full_attention(tmp_path):
    cfg = json.loads(
        (catalog.build(catalog.get("tiny-hybrid"), tmp_path) / "config.json").read_text()
    )
    assert cfg["sliding_window"] == 32
    assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
    assert cfg["head_dim"] >= 32


def test_weights_match_config_shapes_and_are_not_constant(tmp_path):
    from safetensors.numpy import load_file

    path = catalog.build(catalog.get("tiny-llama"), tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    t = load_file(str(path / "model.safetensors"))
    assert t["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert t["lm_head.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert (
        len({k.split(".")[2] for k in t if k.startswith("model.layers.")})
        == cfg["num_hidden_layers"]
    )
    assert float(t["lm_head.weight"].std()) > 0.05


def test_tokenizer_round_trips_text(tmp_path):
    from tokenizers import Tokenizer

    path = catalog.build(catalog.get("tiny-llama"), tmp_path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    enc = tok.encode("The quick brown fox")
    assert enc.ids[0] == tok.token_to_id("<s>")
    assert tok.decode(enc.ids, skip_special_tokens=True) == "The quick brown fox"


def test_rebuild_only_when_missing_or_forced(tmp_path):
    spec = catalog.get("tiny-llama")
    path = catalog.build(spec, tmp_path)
    marker = path / catalog.MARKER
    before = marker.stat().st_mtime_ns
    catalog.build(spec, tmp_path)
    assert marker.stat().st_mtime_ns == before
    catalog.build(spec, tmp_path, force=True)
    assert catalog.is_built(spec, tmp_path)


def test_unknown_model_is_bad_input():
    with pytest.raises(BadInput, match="unknown embedded model 'nope'"):
        catalog.get("nope")
