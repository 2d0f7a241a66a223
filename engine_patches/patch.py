"""What a patch is: its declaration (:class:`Patch`) and its apply outcome.

:class:`Patch` holds name, target, versions, reason and apply function; the apply
function returns an :class:`Outcome` (one of the four statuses).

Besides the human-readable ``versions``, a patch declares for machines:

- ``verified_on``: the vLLM releases it was verified on (``("0.32.0",)``); on any other
  release the registry records ``verified: false`` and ``note: "unverified on X"``;
- ``symbols``: the vLLM code it wraps or reads, as ``"module:Qualified.name"`` (the
  upgrade preflight reads them from a release's sources without importing it);
- ``watch``: vLLM code it relies on without wrapping it (how its targets are called);
- ``attributes``: the vLLM instance attributes it reads or writes, as
  ``"module:Class.attr"``; ``"module:Class.a|b"`` when the patch uses whichever of ``a``
  and ``b`` a release has (the preflight checks each class's source: an attribute that
  no longer appears there means the patch writes something nothing reads);
- ``alternatives``: ``(target, instead)`` pairs: where a release lacks ``target`` the
  patch uses ``instead`` (the V2 model runner's method for the V1 runner's);
- ``upstream``: the structural rule "the fix is already upstream", a pure function of
  ``{symbol: source text or None}`` returning ``(True | False | None, why)`` (None:
  cannot decide). The apply function runs the same rule on the installed sources
  (:func:`installed_sources`), the preflight on a wheel's.

A leaf module (standard library only; vLLM is imported only by
:func:`installed_sources`): the patch modules, :mod:`engine_patches.catalog` and
:mod:`engine_patches.registry` all import it, and it imports none of them, so the
registry can use the catalog without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

APPLIED = "applied"
UPSTREAM = "already upstream"
SKIPPED = "skipped"
FAILED = "failed"
STATUSES = (APPLIED, UPSTREAM, SKIPPED, FAILED)

Sources = Mapping[str, "str | None"]
UpstreamRule = Callable[[Sources], "tuple[bool | None, str]"]


@dataclass(frozen=True)
class Outcome:
    """What applying a patch did: one of :data:`STATUSES` and a detail."""

    status: str
    detail: str = ""


@dataclass(frozen=True)
class Patch:
    """One patch or probe, declared as data: what it targets, why, and how to apply it."""

    name: str
    target: str
    versions: str  # human-readable range, checked by the apply function itself
    reason: str  # upstream PR / issue
    apply: Callable[[], Outcome]
    roles: tuple[str, ...] = ("api_server", "engine_core", "worker")
    verified_on: tuple[str, ...] = ()  # vLLM releases this was verified on
    symbols: tuple[str, ...] = ()  # "module:Qualified.name" it wraps or reads
    watch: tuple[str, ...] = ()  # "module:Qualified.name" it relies on, unwrapped
    upstream: UpstreamRule | None = None  # None: no upstream fix to look for
    # (target, the symbol used instead on a vLLM without it): e.g. the V1 model runner's
    # method and the V2 runner's that a probe wraps where V1 is gone (vLLM 0.34)
    alternatives: tuple[tuple[str, str], ...] = ()
    kind: str = "patch"  # patch | probe
    attributes: tuple[str, ...] = ()  # "module:Class.attr" or "module:Class.a|b" it reads/writes


VERIFIED_ON = ("0.32.0",)  # the release a probe is verified on unless it says otherwise


def dotted(symbol: str) -> str:
    """A symbol as the dotted path a ledger's ``target`` shows.

    ``"vllm.a.b:C.f"`` -> ``"vllm.a.b.C.f"``."""
    return symbol.replace(":", ".", 1)


def declare(
    name: str,
    *,
    apply: Callable[[], Outcome],
    reason: str,
    symbols: tuple[str, ...],
    target: str | None = None,
    **fields: Any,
) -> Patch:
    """A :class:`Patch` whose ``target`` defaults to its first symbol, dotted.

    The other fields are :class:`Patch`'s, with its defaults."""
    return Patch(
        name=name,
        target=target or dotted(symbols[0]),
        apply=apply,
        reason=reason,
        symbols=symbols,
        **fields,
    )


def probe(
    name: str,
    *,
    apply: Callable[[], Outcome],
    reason: str,
    symbols: tuple[str, ...],
    versions: str = "any",
    verified_on: tuple[str, ...] = VERIFIED_ON,
    **fields: Any,
) -> Patch:
    """A probe's declaration: a :class:`Patch` of kind ``probe`` with a probe's defaults.

    For any vLLM release that has its targets, verified on :data:`VERIFIED_ON` unless it
    says otherwise; the rest as :func:`declare`."""
    return declare(
        name,
        apply=apply,
        reason=reason,
        symbols=symbols,
        versions=versions,
        verified_on=verified_on,
        kind="probe",
        **fields,
    )


def symbols(module: str, *qualnames: str) -> tuple[str, ...]:
    """``symbols("vllm.a.b", "C.f", "g")`` -> ``("vllm.a.b:C.f", "vllm.a.b:g")``."""
    return tuple(f"{module}:{q}" for q in qualnames)


def split_symbol(symbol: str) -> tuple[str, str]:
    """``"vllm.a.b:C.f"`` -> ``("vllm.a.b", "C.f")``."""
    module, _, qualname = symbol.partition(":")
    return module, qualname


def release(version: str | None) -> str | None:
    """The release a version string names: ``0.32.0+cpu`` -> ``0.32.0``."""
    if not version:
        return None
    return str(version).split("+", 1)[0].strip() or None


def verification(patch: Patch, version: str | None) -> tuple[bool | None, str | None]:
    """(verified, note) of ``patch`` on vLLM ``version``: None when the version is unknown."""
    rel = release(version)
    if rel is None:
        return None, "vLLM version unknown: cannot tell whether this was verified on it"
    if rel in patch.verified_on:
        return True, None
    return False, f"unverified on {rel}"


def resolve_symbol(name: str) -> Any:
    """The installed vLLM's object for ``module:qualname`` (imports it).

    Raises ImportError or AttributeError when the module or the name is not there."""
    import importlib

    module, qualname = split_symbol(name)
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def missing_symbols(names: Iterable[str]) -> list[str]:
    """The symbols the installed vLLM lacks (module not importable or name not there)."""
    missing = []
    for name in names:
        try:
            resolve_symbol(name)
        except (ImportError, AttributeError):
            missing.append(name)
    return missing


def installed_sources(names: Iterable[str]) -> dict[str, str | None]:
    """The source text of each symbol in the installed vLLM (imports it).

    As ``{symbol: source}``; None for a symbol that is missing or whose source cannot be
    read. A wrapper's original is followed through ``__wrapped__``, so a rule sees vLLM's
    code, not opsctl's wrapper."""
    import inspect

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = inspect.getsource(inspect.unwrap(resolve_symbol(name)))
        except (ImportError, AttributeError, OSError, TypeError):
            out[name] = None
    return out
