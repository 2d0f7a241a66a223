"""Every check opsctl runs, declared once.

A :class:`Check` names a check and says everything the surfaces need: its one-line
summary (``--help``, the README's table), which targets it fits (certify's
applicability, the console's offer), and where its parts live in the layers above this
one, as ``module:attribute`` paths that the layer which may import them resolves
(:mod:`opsctl.checks.registry`): how it runs from certify and on a console's server, its
report type, its exit rule, its renderer and its ``opsctl diag`` flags. The diag
commands, certify, the console's check actions, the ``--tui`` panels and ``--help`` are
all derived from :func:`checks`; adding a check means writing its modules and one
:func:`register` call (the declarations at the end of this module).

Pure: no I/O, and nothing above the domain is imported (paths are strings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# surfaces a check can appear on
DIAG, CERTIFY, CONSOLE = "diag", "certify", "console"
SURFACES = (DIAG, CERTIFY, CONSOLE)

# the console's model families (archetypes by what a check needs of a model)
POOLING = ("cross-encoder", "bi-encoder", "pooling")  # "pooling": kind not known here
GENERATIVE = ("decoder", "hybrid-decoder", "vision-language")
MULTIMODAL = ("vision-language",)


@dataclass(frozen=True, slots=True)
class Subject:
    """What is certified, as far as the checks' applicability goes (facts, no I/O)."""

    managed: bool  # opsctl starts (and stops) the engine
    model: str | None
    archetype: str | None  # decoder | hybrid-decoder | vision-language | cross-encoder | ...
    kv_groups: int | None = None  # KV cache groups (hybrid: > 1), when known
    kv_refusal: str | None = None  # why the fault-injecting connector cannot serve it
    run_dir: bool = False  # an opsctl run directory (patch ledger, probe records) is known
    local: bool = True  # the server runs on this node (/dev/shm, /proc visible)
    mm_probe: str | None = None  # URL + multimodal: why the mm_uuid probe is unusable
    # URL: the server's own prefix caching (vllm:cache_config_info); None: not known
    prefix_caching: bool | None = None

    @property
    def generative(self) -> bool:
        """The model generates text (a decoder, hybrid or vision-language model)."""
        return self.archetype in GENERATIVE

    @property
    def pooling(self) -> bool:
        """The model pools (embedding, scoring or reranking)."""
        return self.archetype in POOLING

    @property
    def multimodal(self) -> bool:
        """The model takes images."""
        return self.archetype == "vision-language"

    def kind(self) -> dict[str, Any]:
        """What kind of model this is, as the certify document records it."""
        return {
            "archetype": self.archetype,
            "generative": self.generative,
            "pooling": self.pooling,
            "multimodal": self.multimodal,
            "hybrid_kv": self.archetype == "hybrid-decoder"
            or (self.kv_groups is not None and self.kv_groups > 1),
        }


@dataclass(frozen=True)
class Offer:
    """When the console offers a check on a server, and why (one line)."""

    kinds: tuple[str, ...]  # archetypes it fits; a server of unknown kind gets every offer
    why: str  # the offer's line, before "; <model kind>"
    opsctl_started: bool = False  # only on servers opsctl started (it reads the run)


@dataclass(frozen=True)
class Check:
    """One check: its name on every surface and where its parts are.

    ``name`` is ``opsctl diag NAME``, certify's check name, the console's action and the
    key of its ``--tui`` panel; ``title`` heads its panel and certify's row. Paths are
    ``module:attribute`` in the layer that owns the part; None where the check has no
    such surface."""

    name: str
    title: str
    summary: str  # one line: --help, the README's table
    report: str  # the report class (checks layer): verdict, warnings, to_dict()
    certify: Callable[[Subject], str | None] | None = None  # why it cannot run (None: it can)
    certify_run: str | None = None  # checks layer: fn(CertifyContext, progress) -> report
    offer: Offer | None = None  # the console's offer
    server_run: str | None = None  # checks layer: fn(ServerRef, progress) -> report
    run: str | None = None  # checks layer: run(target, options, progress) -> report (diag)
    diag: str | None = None  # commands layer: the `opsctl diag NAME` flags -> (target, options)
    outcome: str | None = None  # checks layer: fn(report, options) -> Outcome (exit rule)
    render: str | None = None  # ui layer: fn(console, doc) drawing the report as text
    examples: tuple[str, ...] = field(default=())  # `opsctl diag NAME ...` lines for --help

    def on(self, surface: str) -> bool:
        """Whether the check appears on ``surface`` (one of SURFACES)."""
        if surface == DIAG:
            return self.diag is not None and self.run is not None
        if surface == CERTIFY:
            return self.certify is not None and self.certify_run is not None
        if surface == CONSOLE:
            return self.offer is not None and self.server_run is not None
        raise ValueError(f"unknown surface {surface!r}: one of {', '.join(SURFACES)}")


_CHECKS: dict[str, Check] = {}


def register(check: Check) -> Check:
    """Add ``check`` (its order is certify's, the console's and diag's listing order)."""
    if check.name in _CHECKS:
        raise ValueError(f"check {check.name!r} is registered twice")
    _CHECKS[check.name] = check
    return check


def unregister(name: str) -> None:
    """Remove a registered check (a plugin or test that added one undoes it)."""
    _CHECKS.pop(name, None)


def checks(surface: str | None = None) -> tuple[Check, ...]:
    """The registered checks, in registration order (only those on ``surface``)."""
    return tuple(c for c in _CHECKS.values() if surface is None or c.on(surface))


def names(surface: str | None = None) -> tuple[str, ...]:
    """The names of :func:`checks`."""
    return tuple(c.name for c in checks(surface))


def get(name: str) -> Check:
    """The check called ``name`` (KeyError naming the known ones)."""
    try:
        return _CHECKS[name]
    except KeyError:
        raise KeyError(f"unknown check {name!r}: one of {', '.join(_CHECKS)}") from None


def each(surface: str) -> Iterator[Check]:
    """Iterate the checks on ``surface``."""
    yield from checks(surface)


# ---- certify's applicability rules (Subject -> why not, None: it applies) ------------------

NO_RUN_DIR = (
    "no opsctl run directory for this server (not started by opsctl): its patch ledger "
    "cannot be read"
)


def _kind(s: Subject) -> str:
    return s.archetype or "unknown"


def _always(s: Subject) -> str | None:
    return None


def _needs_run_dir(s: Subject) -> str | None:
    return None if s.run_dir else NO_RUN_DIR


def _needs_local(s: Subject) -> str | None:
    if s.local:
        return None
    return "the server is not on this node: its /dev/shm and /proc are out of reach"


def _needs_pooling(s: Subject) -> str | None:
    if s.pooling:
        return None
    return f"{_kind(s)} model: /score and /rerank usage needs a pooling model (cross-/bi-encoder)"


def _needs_generative(s: Subject) -> str | None:
    if s.generative:
        return None
    return f"{_kind(s)} model: batch invariance compares generated tokens"


def _needs_multimodal(s: Subject) -> str | None:
    if not s.multimodal:
        return f"{_kind(s)} model: no multimodal items to identify"
    return None if s.managed else s.mm_probe


def _needs_fault_connector(s: Subject) -> str | None:
    if not s.managed:
        return (
            "a URL cannot host kv-fail injection: it needs an engine opsctl starts with its "
            "fault-injecting KV connector (certify --model)"
        )
    if s.kv_refusal:
        return f"the fault-injecting KV connector cannot serve {s.model}: {s.kv_refusal}"
    return None


def _needs_managed(s: Subject) -> str | None:
    return None if s.managed else "opsctl did not start this server, so it does not stop it"


# ---- the registrations (certify runs them in this order) -----------------------------------

_CHECKS_MOD = "opsctl.checks"
register(
    Check(
        "liveness",
        "liveness: /health, one request, forward progress",
        "/health, one request and forward progress in /metrics.",
        report=f"{_CHECKS_MOD}.report:Report",
        certify=_always,
        certify_run=f"{_CHECKS_MOD}.liveness:certify",
    )
)
register(
    Check(
        "patches",
        "patch ledger: no failed patch, test knobs off",
        "The engine-patch ledger: no failed patch, no test knob on.",
        report=f"{_CHECKS_MOD}.report:Report",
        certify=_needs_run_dir,
        certify_run=f"{_CHECKS_MOD}.hygiene:certify_patches",
    )
)
register(
    Check(
        "engram",
        "Engram hygiene: no orphans, fill verified, /dev/shm capacity",
        "Engram tables: no orphans, fill verified, /dev/shm capacity.",
        report=f"{_CHECKS_MOD}.report:Report",
        certify=_needs_local,
        certify_run=f"{_CHECKS_MOD}.hygiene:certify_engram",
    )
)
register(
    Check(
        "usage",
        "/score and /rerank usage against the engine inputs",
        "/score and /rerank usage against the engine inputs.",
        report=f"{_CHECKS_MOD}.usage:Report",
        certify=_needs_pooling,
        certify_run=f"{_CHECKS_MOD}.usage:certify",
        offer=Offer(POOLING, "pooling /score, /rerank usage"),
        server_run=f"{_CHECKS_MOD}.usage:on_server",
        run=f"{_CHECKS_MOD}.usage:run",
        diag="opsctl.commands.diag.usage:usage",
        outcome=f"{_CHECKS_MOD}.usage:outcome",
        render="opsctl.ui.render_usage:render",
        examples=(
            "opsctl diag usage --model tiny-reranker",
            "opsctl diag usage 127.0.0.1:8000 --json",
            "opsctl diag usage http://127.0.0.1:8000 --timeout 2m --no-tui",
        ),
    )
)
register(
    Check(
        "invariance",
        "batch invariance (BS=1 vs BS=N tokens and logprobs)",
        "BS=1 vs BS=N batch invariance of tokens and logprobs.",
        report=f"{_CHECKS_MOD}.invariance:InvarianceReport",
        certify=_needs_generative,
        certify_run=f"{_CHECKS_MOD}.invariance:certify",
        offer=Offer(GENERATIVE, "BS=1 vs BS=N on the server as it is"),
        server_run=f"{_CHECKS_MOD}.invariance:on_server",
        run=f"{_CHECKS_MOD}.invariance:run",
        diag="opsctl.commands.diag.invariance:invariance",
        outcome=f"{_CHECKS_MOD}.invariance:outcome",
        render="opsctl.ui.render_invariance:render",
        examples=(
            "opsctl diag invariance --model tiny-llama --mode eager",
            "opsctl diag invariance 127.0.0.1:8000 --prompts prompts.txt --json",
            "opsctl diag invariance --model tiny-vlm-multi --images 2 --atol 1e-4",
        ),
    )
)
register(
    Check(
        "mm-uuid",
        "multimodal UUIDs kept by the engine",
        "Which multimodal identifier reached the engine core.",
        report=f"{_CHECKS_MOD}.mm_uuid:Report",
        certify=_needs_multimodal,
        certify_run=f"{_CHECKS_MOD}.mm_uuid:certify",
        offer=Offer(MULTIMODAL, "multimodal UUIDs (needs the mm_uuid probe)"),
        server_run=f"{_CHECKS_MOD}.mm_uuid:on_server",
        run=f"{_CHECKS_MOD}.mm_uuid:run",
        diag="opsctl.commands.diag.mm_uuid:mm_uuid",
        outcome=f"{_CHECKS_MOD}.mm_uuid:outcome",
        render="opsctl.ui.render_mm_uuid:render",
        examples=(
            "opsctl diag mm-uuid",
            "opsctl diag mm-uuid --mode caches-on --json",
            "opsctl diag mm-uuid 127.0.0.1:8000 --run 20260101-000000-serve-tiny-vlm-multi-8000",
        ),
    )
)
register(
    Check(
        "kv-fail",
        "KV load failure: engine survives, requests recompute",
        "Inject KV load failures and prove recovery.",
        report=f"{_CHECKS_MOD}.kv_fail:KvFailReport",
        certify=_needs_fault_connector,
        certify_run=f"{_CHECKS_MOD}.kv_fail:certify",
        offer=Offer(GENERATIVE, "starts its own engine with this model", opsctl_started=True),
        server_run=f"{_CHECKS_MOD}.kv_fail:on_server",
        run=f"{_CHECKS_MOD}.kv_fail:run",
        diag="opsctl.commands.diag.kv_fail:kv_fail",
        outcome=f"{_CHECKS_MOD}.kv_fail:outcome",
        render="opsctl.ui.render_kv_fail:render",
        examples=(
            "opsctl diag kv-fail",
            "opsctl diag kv-fail --model tiny-llama --rate 0.5 --json",
            "opsctl diag kv-fail --no-patch --fail-requests 2 --timeout 15m",
            "opsctl diag kv-fail --model tiny-llama --mode default --policy fail",
            "opsctl diag kv-fail --route requests --no-patch",
        ),
    )
)
register(
    Check(
        "lora",
        "LoRA adapters alone and in one mixed batch",
        "LoRA adapters alone and in one mixed batch.",
        report=f"{_CHECKS_MOD}.lora:LoraReport",
        run=f"{_CHECKS_MOD}.lora:run",
        diag="opsctl.commands.diag.lora:lora",
        outcome=f"{_CHECKS_MOD}.lora:outcome",
        render="opsctl.ui.render_lora:render",
        examples=(
            "opsctl diag lora --model tiny-llama",
            "opsctl diag lora --model tiny-vlm-multi --max-loras 3 --json",
            "opsctl diag lora 127.0.0.1:8000 --adapters ./a1 --adapters ./a2",
        ),
    )
)
register(
    Check(
        "shutdown",
        "shutdown hygiene: 0 processes, 0 /dev/shm segments left",
        "After the engines stop: no process and no /dev/shm segment left.",
        report=f"{_CHECKS_MOD}.report:Report",
        certify=_needs_managed,
        certify_run=f"{_CHECKS_MOD}.hygiene:certify_shutdown",
    )
)
