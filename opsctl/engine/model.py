"""Resolve the MODEL argument: an embedded model name or a model directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsctl.collectors.jsonfile import load_json_object
from opsctl.embedded import catalog
from opsctl.errors import BadInput


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model ready to serve: served name, directory, archetype and config.json."""

    name: str  # served model name
    path: Path
    archetype: str
    embedded: bool
    config: dict

    @property
    def architectures(self) -> list[str]:
        """The model's architectures from its config.json."""
        return list(self.config.get("architectures") or [])


def archetype_of(config: dict) -> str:
    """The archetype (decoder, bi-/cross-encoder, vision-language...) of a config.json."""
    archs = " ".join(config.get("architectures") or [])
    if "SequenceClassification" in archs:
        return "cross-encoder"
    if archs in ("BertModel", "XLMRobertaModel") or archs.endswith("Model"):
        return "bi-encoder"
    if "ConditionalGeneration" in archs:
        return "vision-language"
    if config.get("layer_types") and len(set(config["layer_types"])) > 1:
        return "hybrid-decoder"
    return "decoder"


def read_config(path: Path) -> dict:
    """The config.json of the model directory ``path``; BadInput when missing or malformed."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise BadInput(f"model directory {path} has no config.json")
    return load_json_object(cfg_path)


def resolve(model: str | None) -> ResolvedModel:
    """Resolve and validate a model argument without starting anything."""
    model = model or catalog.DEFAULT_MODEL
    looks_like_path = "/" in model or model.startswith(".") or Path(model).exists()
    if not looks_like_path:
        spec = catalog.get(model)  # raises BadInput for unknown names
        path = catalog.build(spec)
        return ResolvedModel(spec.name, path, spec.archetype, True, read_config(path))
    path = Path(model).expanduser().resolve()
    if not path.exists():
        raise BadInput(f"model directory {model} does not exist")
    if not path.is_dir():
        raise BadInput(f"model path {model} is not a directory")
    config = read_config(path)
    return ResolvedModel(path.name, path, archetype_of(config), False, config)
