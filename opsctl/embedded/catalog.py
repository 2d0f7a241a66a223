"""The catalog of embedded models and their on-disk cache.

A model is built on first use into ``$OPSCTL_HOME/models/<name>`` (atomically: built
in a temporary directory, then renamed) and rebuilt when its builder version changes.

Every model directory opsctl builds carries a marker file (:data:`MARKER`: name,
archetype, builder version). opsctl replaces an existing directory only when that
marker says opsctl built it: a directory (or file, or symlink) at the target path
without it is someone else's, and :func:`build` refuses with BadInput (exit 2)
naming the path, deleting nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opsctl import paths
from opsctl.embedded import builds
from opsctl.errors import BadInput

MARKER = ".opsctl-model.json"


@dataclass(frozen=True, slots=True)
class EmbeddedModel:
    """One model opsctl can build itself: name, archetype, builder and version."""

    name: str
    archetype: str
    description: str
    builder: str  # "module:function", imported lazily
    version: int = 1
    images_per_prompt: int = 1  # vision-language: images one prompt may carry

    def build_fn(self) -> Callable[[Path], None]:
        """The function that writes this model into a directory (imported now)."""
        import importlib

        module, fn = self.builder.split(":")
        return getattr(importlib.import_module(module), fn)


CATALOG: dict[str, EmbeddedModel] = {
    m.name: m
    for m in [
        EmbeddedModel(
            "tiny-llama",
            "decoder",
            "Llama, 2 layers, one KV cache group",
            "opsctl.embedded.llama:build_tiny_llama",
        ),
        EmbeddedModel(
            "tiny-hybrid",
            "hybrid-decoder",
            "Llama, 4 layers, sliding-window + full attention (2 KV cache groups)",
            "opsctl.embedded.llama:build_tiny_hybrid",
        ),
        EmbeddedModel(
            "tiny-reranker",
            "cross-encoder",
            "BERT cross-encoder (BertForSequenceClassification, 1 label): /score, /rerank",
            "opsctl.embedded.bert:build_tiny_reranker",
            version=2,
        ),
        EmbeddedModel(
            "tiny-embed",
            "bi-encoder",
            "BERT bi-encoder (BertModel): /v1/embeddings, /score, /rerank",
            "opsctl.embedded.bert:build_tiny_embed",
            version=2,
        ),
        EmbeddedModel(
            "tiny-vlm",
            "vision-language",
            "BLIP-2: ViT + Q-Former + tiny Llama, one image per prompt (no torchvision)",
            "opsctl.embedded.blip2:build_tiny_vlm",
        ),
        EmbeddedModel(
            "tiny-vlm-multi",
            "vision-language",
            "Idefics3: ViT + pixel-shuffle connector + tiny Llama, several images per prompt "
            "(no torchvision)",
            "opsctl.embedded.idefics3:build_tiny_vlm_multi",
            images_per_prompt=4,
        ),
    ]
}

DEFAULT_MODEL = "tiny-llama"


def register(model: EmbeddedModel) -> None:
    """Add ``model`` to the catalog under its name."""
    CATALOG[model.name] = model


def get(name: str) -> EmbeddedModel:
    """The embedded model named ``name``; BadInput naming the known ones when unknown."""
    try:
        return CATALOG[name]
    except KeyError:
        raise BadInput(
            f"unknown embedded model {name!r}; known: {', '.join(sorted(CATALOG))}",
            hint="pass an embedded model name or a model directory",
        ) from None


def model_path(name: str, root: Path | None = None) -> Path:
    """Where the embedded model ``name`` is built (under ``root`` or opsctl's models dir)."""
    return (root or paths.models_dir()) / name


def is_built(model: EmbeddedModel, root: Path | None = None) -> bool:
    """Whether ``model`` is built at this builder version."""
    marker = model_path(model.name, root) / MARKER
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == model.version


def built_by_opsctl(path: Path) -> bool:
    """Whether ``path`` is a real directory holding opsctl's marker for a model of that name.

    Any builder version: only such a directory may be replaced."""
    return builds.built_by_opsctl(path, MARKER)


def check_target(model: EmbeddedModel, root: Path | None = None) -> Path:
    """The model's directory under ``root``; BadInput when something else is there.

    BadInput (exit 2, with the path) when something opsctl did not build is there; nothing is
    deleted."""
    dest = model_path(model.name, root)
    if (dest.exists() or dest.is_symlink()) and not built_by_opsctl(dest):
        raise BadInput(
            f"{dest} exists and was not built by opsctl (no {MARKER}); not replacing it",
            hint="choose another --out directory, or move it away yourself",
        )
    if root is not None and root.exists() and not root.is_dir():
        raise BadInput(f"--out {root} is not a directory")
    return dest


def build(model: EmbeddedModel, root: Path | None = None, force: bool = False) -> Path:
    """Build ``model`` (unless built, or with ``force``); its directory."""
    dest = model_path(model.name, root)
    if not force and is_built(model, root):
        return dest
    check_target(model, root)
    marker = {"name": model.name, "archetype": model.archetype, "version": model.version}
    return builds.build_into(dest, MARKER, marker, model.build_fn())


def ensure(name: str, root: Path | None = None) -> Path:
    """The directory of the embedded model ``name``, built first when needed."""
    return build(get(name), root)


def dir_size(path: Path) -> int:
    """The total size of the files under ``path``, in bytes."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
