"""What `diag lora` runs against, decided before anything starts.

The options, the adapters (the embedded ones of an embedded model, or PEFT directories
given), the images per request and the engine spec with every LoRA argument. Bad input
is refused here (:class:`BadInput`, exit 2), before an engine or a panel starts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.checks.sampling import check_sampling
from opsctl.checks.target import EngineSpec, Target, UrlTarget
from opsctl.domain.check_registry import GENERATIVE
from opsctl.errors import BadInput
from opsctl.suite.lora import collect as collect
from opsctl.suite.lora import judge

DEFAULT_MODEL = "tiny-llama"
PROBES = frozenset({"batch", "lora", "gate"})


@dataclass(frozen=True)
class Options:
    """What the CLI flags set. Invalid values are :class:`BadInput` (exit 2)."""

    adapters: tuple[str, ...] = ()  # PEFT adapter dirs; (): embedded / the server's
    max_tokens: int = 32
    logprobs: int = 5
    atol: float | None = None  # mixed vs alone logprob tolerance; None: bitwise
    images: int | None = None  # images per request; None: by model (0 text-only)
    timeout: float | None = None  # seconds for a started engine's /health; None: spec's
    request_timeout: float = 120.0
    tag: str | None = None  # request-id tag; None: a fresh opsctl-lora-XXXXXX
    max_loras: int | None = None  # LoRA slots of a started engine; None: one per adapter
    attempts: int = 6  # sends of the mixed batch until the probe shows it mixed adapters
    # (6: under a CPU hog 3 sends of 6 requests never all shared a step)
    seeds: tuple[int, ...] = ()  # a sweep: one seeded prompt set per seed, on one engine

    def __post_init__(self) -> None:
        object.__setattr__(self, "adapters", tuple(self.adapters))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if any(s < 0 for s in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise BadInput("--seeds must be distinct non-negative integers")
        check_sampling(self.max_tokens, self.logprobs, self.atol)
        if self.images is not None and self.images < 0:
            raise BadInput("--images must be 0 or more")
        if self.timeout is not None and self.timeout <= 0:
            raise BadInput("--timeout must be positive")
        if self.max_loras is not None and self.max_loras < 1:
            raise BadInput("--max-loras must be at least 1")
        if self.attempts < 1:
            raise BadInput("attempts must be at least 1")


@dataclass(frozen=True, slots=True)
class Adapter:
    """An adapter the check uses: where it comes from and the parts it targets."""

    name: str
    path: Path | None
    source: str  # embedded | dir | server
    parts: tuple[str, ...] = ()  # () : not known (an adapter opsctl did not build)
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The adapter as the report lists it: name, path, source, parts, rank."""
        return {
            "name": self.name,
            "path": str(self.path) if self.path else None,
            "source": self.source,
            "parts": list(self.parts),
            "rank": self.rank,
        }


def embedded_adapters(model: str) -> list[Adapter]:
    """The embedded adapters of embedded model ``model``, built on first use."""
    from opsctl.embedded import lora as built

    paths = built.ensure(model)
    return [
        Adapter(s.name, paths[s.name], "embedded", s.parts, built.RANK)
        for s in built.adapters_for(model)
    ]


def dir_adapters(dirs: tuple[str, ...]) -> list[Adapter]:
    """The adapters in PEFT directories ``dirs`` (BadInput for two with one name)."""
    out = [collect.read_adapter_dir(d) for d in dirs]
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise BadInput(f"adapter directories must have distinct names, got {names}")
    return [Adapter(a.name, a.path, "dir", (), a.rank) for a in out]


def images_for(model: str | None, archetype: str | None, options: Options) -> int:
    """Images per request: the option, else by the model.

    0 for a text model, 2 for a model that takes several (the catalog's
    images_per_prompt), else 1."""
    from opsctl.embedded import catalog

    if options.images is not None:
        return options.images
    if archetype != "vision-language":
        return 0
    spec = catalog.CATALOG.get(model or "")
    return 2 if spec is not None and spec.images_per_prompt > 1 else 1


@dataclass(frozen=True)
class Plan:
    """What diag lora runs: the target, the adapters, the images per request."""

    target: Target  # the URL, or the spec with every LoRA argument
    adapters: tuple[Adapter, ...]  # () for a URL without --adapters: the server's
    images: int | None  # None: decided once the URL's model is known
    model: str | None = None


def lora_spec(
    spec: EngineSpec, adapters: list[Adapter], images: int, options: Options
) -> EngineSpec:
    """The engine the check starts: ``spec`` plus LoRA, the probes and room for the batch."""
    rank = judge.lora_rank([a.rank or 8 for a in adapters])
    args = [
        "--enable-lora",
        "--max-loras",
        str(options.max_loras or len(adapters)),
        "--max-lora-rank",
        str(rank),
        "--lora-modules",
        *(f"{a.name}={a.path}" for a in adapters),
        "--no-enable-prefix-caching",
    ]
    if images:
        args += ["--enable-tower-connector-lora", "--mm-processor-cache-gb", "0"]
    if images > 1:
        args += ["--limit-mm-per-prompt", json.dumps({"image": images})]
    mixed = len(judge.plan_mixed([a.name for a in adapters], images))
    return spec.with_defaults(
        DEFAULT_MODEL,
        extra_args=(*spec.extra_args, *args),
        probes=spec.probes | PROBES,
        max_num_seqs=max(spec.max_num_seqs, mixed),
        enforce_eager=False,
        timeout=options.timeout or spec.timeout,
    )


def plan(target: Target, options: Options) -> Plan:
    """The plan of ``options`` on ``target``, bad input refused before anything starts.

    Refuses adapter dirs that cannot be read and a pooling model, and builds the engine
    spec; a URL keeps its adapters open until its server is seen."""
    given = dir_adapters(options.adapters) if options.adapters else []
    if isinstance(target, UrlTarget):
        if options.max_loras is not None:
            raise BadInput("--max-loras needs an engine opsctl starts (use --model, not a URL)")
        return Plan(target, tuple(given), options.images)
    from opsctl.engine.model import resolve

    resolved = resolve(target.model or DEFAULT_MODEL)
    if resolved.archetype not in GENERATIVE:
        raise BadInput(
            f"{resolved.name} is a {resolved.archetype} model; diag lora needs a generative "
            "model (e.g. tiny-llama)"
        )
    if not given and not resolved.embedded:
        raise BadInput(f"no embedded LoRA adapters for the model directory {resolved.path}")
    adapters = given or embedded_adapters(resolved.name)
    if len(adapters) < 2:
        raise BadInput(f"{len(adapters)} adapter given; the mixed batch needs at least 2")
    if options.max_loras is not None and options.max_loras < len(adapters):
        raise BadInput(
            f"--max-loras {options.max_loras} is below the {len(adapters)} adapters: they could "
            "never share a step"
        )
    images = images_for(resolved.name, resolved.archetype, options)
    spec = lora_spec(target, adapters, images, options)
    return Plan(spec, tuple(adapters), images, resolved.name)
