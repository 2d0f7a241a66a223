"""Seeded LoRA adapters for the embedded models, in PEFT format, for ``opsctl diag lora``.

Files: ``adapter_config.json`` + ``adapter_model.safetensors``.

Every adapter is a function of (model, name): the same bytes on every build (seeded
numpy weights, sorted keys, fixed JSON). Weights are random at a scale that moves the
outputs visibly (not PEFT's zero-initialised B), and each adapter of a model has its own
seed and modules, so outputs differ from the base model and from each other.

Module names are vLLM's names of the base model's layers (the embedded models need no
weight-name mapping): the decoder's attention and MLP projections, and for the
vision-language models also the vision tower and connector layers vLLM 0.32 can wrap
with LoRA (its ``LinearBase`` layers). BLIP-2's vision ``qkv`` (one QKVParallelLinear
not listed in the model's packed modules) and its Q-Former and language projection
(plain ``torch.nn.Linear``) cannot be wrapped, so no adapter targets them.

An adapter is built on first use into ``$OPSCTL_HOME/adapters/<model>/<name>``
(atomically: built in a temporary directory, then renamed) with a marker file
(:data:`MARKER`); a directory without the marker is never replaced (BadInput).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opsctl import paths
from opsctl.embedded import blip2, builds, idefics3, llama, weights
from opsctl.errors import BadInput

MARKER = ".opsctl-adapter.json"
VERSION = 1
RANK = 8
ALPHA = 16
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

LANGUAGE, TOWER, CONNECTOR = "language", "tower", "connector"


def _llama_modules(prefix: str) -> dict[str, tuple[int, int]]:
    """The tiny Llama's projections under ``prefix``: name -> (out, in)."""
    h, kv, inter = llama.HIDDEN, llama.KV_HEADS * llama.HEAD_DIM, llama.INTER
    dims = {
        "self_attn.q_proj": (llama.HEADS * llama.HEAD_DIM, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, llama.HEADS * llama.HEAD_DIM),
        "mlp.gate_proj": (inter, h),
        "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
    }
    return {f"{prefix}layers.{i}.{k}": v for i in range(2) for k, v in dims.items()}


def _blip2_tower() -> dict[str, tuple[int, int]]:
    v, inter = blip2.V_HIDDEN, blip2.V_INTER
    p = "vision_model.encoder.layers.0."
    return {
        f"{p}self_attn.projection": (v, v),
        f"{p}mlp.fc1": (inter, v),
        f"{p}mlp.fc2": (v, inter),
    }


def _idefics3_tower() -> dict[str, tuple[int, int]]:
    v, inter = idefics3.V_HIDDEN, idefics3.V_INTER
    p = "model.vision_model.encoder.layers.0."
    out = {f"{p}self_attn.{n}": (v, v) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    out.update({f"{p}mlp.fc1": (inter, v), f"{p}mlp.fc2": (v, inter)})
    return out


def _idefics3_connector() -> dict[str, tuple[int, int]]:
    in_dim = idefics3.V_HIDDEN * idefics3.SCALE_FACTOR**2
    return {"model.connector.modality_projection.proj": (llama.HIDDEN, in_dim)}


# model -> part -> module -> (out, in): every module an adapter of that model may target
MODULES: dict[str, dict[str, dict[str, tuple[int, int]]]] = {
    "tiny-llama": {LANGUAGE: _llama_modules("model.")},
    "tiny-vlm": {LANGUAGE: _llama_modules("language_model.model."), TOWER: _blip2_tower()},
    "tiny-vlm-multi": {
        LANGUAGE: _llama_modules("model.text_model."),
        TOWER: _idefics3_tower(),
        CONNECTOR: _idefics3_connector(),
    },
}


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """One embedded adapter: the parts and modules it targets, its seed and B scale.

    The modules of each part are name suffixes (empty: all); the strength scales its B matrices."""

    name: str
    parts: tuple[str, ...]
    seed: int
    strength: float = 1.0
    suffixes: tuple[str, ...] = ()
    description: str = ""


_TEXT_A = AdapterSpec("alpha", (LANGUAGE,), 1101, 1.0, description="attention + MLP, seed 1101")
_TEXT_B = AdapterSpec(
    "beta",
    (LANGUAGE,),
    2202,
    1.2,
    ("q_proj", "v_proj", "down_proj"),
    "q/v/down projections, seed 2202",
)


def _vlm_adapters(parts: tuple[str, ...]) -> tuple[AdapterSpec, ...]:
    where = " + ".join(parts)
    return (
        AdapterSpec("alpha", parts, 1101, 1.0, description=f"{where}, seed 1101"),
        AdapterSpec("beta", parts, 2202, 1.2, description=f"{where}, seed 2202"),
        AdapterSpec(
            "vision",
            parts[1:],
            3303,
            3.0,
            description=f"{' + '.join(parts[1:])} only (no language-model module), seed 3303",
        ),
    )


ADAPTERS: dict[str, tuple[AdapterSpec, ...]] = {
    "tiny-llama": (_TEXT_A, _TEXT_B),
    "tiny-vlm": _vlm_adapters((LANGUAGE, TOWER)),
    "tiny-vlm-multi": _vlm_adapters((LANGUAGE, TOWER, CONNECTOR)),
}


def adapters_for(model: str) -> tuple[AdapterSpec, ...]:
    """The embedded adapters of an embedded model; BadInput for any other model."""
    try:
        return ADAPTERS[model]
    except KeyError:
        raise BadInput(
            f"no embedded LoRA adapters for {model!r} (have: {', '.join(sorted(ADAPTERS))})",
            hint="pass --adapters DIR (PEFT adapter directories) for other models",
        ) from None


def targets(model: str, spec: AdapterSpec) -> dict[str, tuple[int, int]]:
    """The modules ``spec`` targets on ``model``: name -> (out, in)."""
    out: dict[str, tuple[int, int]] = {}
    for part in spec.parts:
        for name, dims in MODULES[model][part].items():
            if not spec.suffixes or name.rsplit(".", 1)[-1] in spec.suffixes:
                out[name] = dims
    return out


def tensors(model: str, spec: AdapterSpec) -> dict[str, np.ndarray]:
    """The adapter's PEFT tensors (``lora_A`` and ``lora_B`` of every module).

    PEFT tensors: ``base_model.model.<module>.lora_A.weight`` (r, in) and
    ``.lora_B.weight`` (out, r). ``A`` keeps activations at their scale; ``B`` makes the
    update ``scaling * B @ A`` comparable to the base weight (times ``strength``)."""
    out: dict[str, np.ndarray] = {}
    # A x keeps x's scale; B then adds strength * half the base layer's output scale
    # (the embedded layers' weights have std 1.5/sqrt(in): output std 1.5 x's)
    b_std = 0.75 / ((ALPHA / RANK) * math.sqrt(RANK))
    for name, (d_out, d_in) in targets(model, spec).items():
        key = f"base_model.model.{name}"
        a = weights.seeded(f"{name}.A", (RANK, d_in), 1.0 / math.sqrt(d_in), spec.seed)
        b = weights.seeded(f"{name}.B", (d_out, RANK), spec.strength * b_std, spec.seed)
        out[f"{key}.lora_A.weight"] = a
        out[f"{key}.lora_B.weight"] = b
    return out


def adapter_config(model: str, spec: AdapterSpec) -> dict:
    """PEFT's LoraConfig fields (what vLLM's PEFTHelper reads)."""
    return {
        "base_model_name_or_path": model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": RANK,
        "target_modules": sorted(targets(model, spec)),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def write(out: Path, model: str, spec: AdapterSpec) -> None:
    """Write the adapter's two PEFT files into the directory ``out``."""
    text = json.dumps(adapter_config(model, spec), indent=2, sort_keys=True) + "\n"
    (out / CONFIG_FILE).write_text(text)
    weights.save(out / WEIGHTS_FILE, tensors(model, spec))


# ---- the on-disk cache (same rules as the models' catalog) ---------------------------


def adapters_dir() -> Path:
    """Where opsctl builds its adapters."""
    return paths.opsctl_home() / "adapters"


def adapter_path(model: str, name: str, root: Path | None = None) -> Path:
    """Where adapter ``name`` of ``model`` is built."""
    return (root or adapters_dir()) / model / name


def _marker(model: str, spec: AdapterSpec) -> dict:
    return {"model": model, "name": spec.name, "version": VERSION, "parts": list(spec.parts)}


def is_built(model: str, spec: AdapterSpec, root: Path | None = None) -> bool:
    """Whether adapter ``spec`` of ``model`` is built, as this version builds it."""
    meta = builds.read_marker(adapter_path(model, spec.name, root), MARKER)
    return meta == _marker(model, spec)


def built_by_opsctl(path: Path) -> bool:
    """Whether ``path`` holds opsctl's adapter marker for that name.

    It must be a real directory: only such a directory may be replaced."""
    return builds.built_by_opsctl(path, MARKER)


def build(model: str, spec: AdapterSpec, root: Path | None = None, force: bool = False) -> Path:
    """The adapter's directory, built (atomically) unless an up-to-date one is there."""
    dest = adapter_path(model, spec.name, root)
    if not force and is_built(model, spec, root):
        return dest
    if (dest.exists() or dest.is_symlink()) and not built_by_opsctl(dest):
        raise BadInput(f"{dest} exists and was not built by opsctl (no {MARKER}); not replacing it")
    marker = dict(sorted(_marker(model, spec).items()))
    return builds.build_into(dest, MARKER, marker, lambda tmp: write(tmp, model, spec), "adapters")


def ensure(model: str, root: Path | None = None) -> dict[str, Path]:
    """Every embedded adapter of ``model``, built on first use: name -> directory."""
    return {spec.name: build(model, spec, root) for spec in adapters_for(model)}
