"""Every check opsctl runs: one typed :class:`Check` each, found in its own folder.

Design (issue 46): a check is one folder, ``opsctl/suite/<name>/``. Its ``__init__.py``
declares ``CHECK``, one :class:`Check`: its name, title and summary (``--help``), its
order among the checks, which targets it fits (certify's applicability, the console's
offer) and its ``opsctl diag`` examples. The rest of the folder is its code, one file
per role: ``judge*.py`` pure, ``collect*.py`` I/O, ``run.py`` the library call (its
:class:`Parts`, read by :meth:`Parts.of`: report type, runs for diag, certify and a
console's server, exit rule, JSON schema, the engines certify must start for it),
``flags.py`` the diag flags (``flags``), ``view.py`` the renderer (``render``). The
registry imports a role file when a surface first needs it (:meth:`Check.parts`,
:meth:`Check.diag_flags`). A check whose code still lives in the layer folders says where
with two loaders, ``load`` (its :class:`Parts`) and ``flags``; its folder holds only the
declaration.

:func:`checks` finds the folders by scanning the ``opsctl.suite`` package (pkgutil), so
adding a check edits no other file: the diag commands, certify's selection and engine
plan, the console's check actions and ``--help`` all read :func:`checks`. A declaration
imports only pure modules at its top (tests/unit/test_layers.py holds it to that), so
finding the checks loads no I/O layer: the loaders import the check's code inside their
bodies, when a surface calls them (``opsctl --help`` loads flags, never torch or vLLM).

Pure but for one reach outside: :func:`discover` lists the suite package's folders
(pkgutil) and imports their declarations, which are pure themselves. Nothing above the
domain is imported here; a check's own code is loaded by its declaration's loaders.

Why not ``module:attribute`` strings (as before): a string hides the import from the
layer and cycle tests and from tools, and every surface had to resolve it; a loader is
an ordinary function whose imports those tests read. Why a folder per check: the check
is then one place, and adding one touches no shared file (the toy check of
tests/unit/test_check_registry.py proves it). Why engine hooks (``Parts.engines``,
``shared_base``, ``shared_engine``): certify's planner asks each check what it needs
instead of naming checks (opsctl.checks.certify_plan).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from opsctl.domain.findings import Finding

SUITE = "opsctl.suite"  # the package whose sub-packages are the checks

# surfaces a check can appear on
DIAG, CERTIFY, CONSOLE = "diag", "certify", "console"
SURFACES = (DIAG, CERTIFY, CONSOLE)

# the console's model families (archetypes by what a check needs of a model)
POOLING = ("cross-encoder", "bi-encoder", "pooling")  # "pooling": kind not known here
GENERATIVE = ("decoder", "hybrid-decoder", "vision-language")
MULTIMODAL = ("vision-language",)

Rule = Callable[["Subject"], "str | None"]  # why a check cannot run on a subject (None: it can)


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
class Parts:
    """A check's code, as :attr:`Check.load` returns it (None: the check has no such part).

    The calls take the typed arguments of :mod:`opsctl.checks.registry`: certify's
    ``CertifyContext``, a console's ``ServerRef``, certify's ``Planning``."""

    report: Callable[..., Any] | None = None  # the report class: Report(verdict, document)
    run: Callable[..., Any] | None = None  # diag: run(target, options, progress) -> report
    certify: Callable[..., Any] | None = None  # certify: fn(CertifyContext, progress) -> report
    on_server: Callable[..., Any] | None = None  # console: fn(ServerRef, progress) -> report
    outcome: Callable[..., Any] | None = None  # exit rule: fn(report, options) -> Outcome
    options: Callable[[], Any] | None = None  # the options class (its defaults: Options())
    render: Callable[..., None] | None = None  # render(console, doc): the report as text
    schema: str | None = None  # its document's schema ("diag.usage/2": opsctl.diag.usage/2)
    default_model: str | None = None  # the model it starts without --model
    # certify's engines (opsctl.checks.registry.Planning; each takes the check's options)
    certify_options: Callable[..., Any] | None = None  # fn(certify Options, managed) -> options
    engines: Callable[..., Any] | None = None  # fn(Planning, options) -> Need (default: main)
    shared_base: Callable[..., Any] | None = None  # fn(spec, Planning, options) -> spec
    shared_engine: Callable[..., Any] | None = None  # fn(spec, Planning, options) -> spec

    @classmethod
    def of(cls, library: Any, **parts: Any) -> Parts:
        """The parts a check's library module defines under their own names, plus ``parts``.

        The names: ``Report`` (``report``), ``run``, ``certify``, ``on_server``,
        ``outcome``, ``Options`` (``options``), ``render``, ``SCHEMA`` (``schema``),
        ``DEFAULT_MODEL``, ``certify_options``, ``engines``, ``shared_base``,
        ``shared_engine``."""
        named = {"report": "Report", "options": "Options", "schema": "SCHEMA"}
        named["default_model"] = "DEFAULT_MODEL"
        found = {
            f: getattr(library, named.get(f, f))
            for f in cls.__dataclass_fields__
            if hasattr(library, named.get(f, f))
        }
        return cls(**{**found, **parts})


@dataclass(frozen=True)
class Check:
    """One check: its name on every surface, where it applies and how its code loads.

    ``name`` is ``opsctl diag NAME``, certify's check name, the console's action and the
    key of its ``--tui`` panel; ``title`` heads its panel and certify's row. ``order``
    places it among the checks (certify runs them, and every surface lists them, by
    order). ``flags`` and ``load`` import the check's code when called, never before."""

    name: str
    title: str
    summary: str  # one line: --help, the README's table
    order: int
    # loaders for a check whose code is not in its folder (None: the folder's role files)
    load: Callable[[], Parts] | None = None  # the check's code (imported on the call)
    flags: Callable[[], Callable[..., tuple[Any, Any]]] | None = None  # diag's flags function
    certify: Rule | None = None  # certify: why it cannot run on a subject (None: it can)
    excluded: Rule | None = None  # why the server's own configuration leaves it out (certify)
    findings: Callable[[Mapping[str, Any]], tuple[Finding, ...]] | None = None  # beyond its list
    after_engines: bool = False  # certify runs it once every engine stopped (it opens none)
    offer: Offer | None = None  # the console's offer
    examples: tuple[str, ...] = field(default=())  # `opsctl diag NAME ...` lines for --help
    home: str | None = None  # its folder's package (set where the registry found it)

    def parts(self) -> Parts:
        """The check's code: its ``load``, else its folder's ``run.py`` and ``view.py``."""
        if self.load is not None:
            return self.load()
        run = importlib.import_module(f"{self.home}.run")
        view = self._role("view")
        return Parts.of(run, **({"render": view.render} if view else {}))

    def diag_flags(self) -> Callable[..., tuple[Any, Any]]:
        """The ``opsctl diag NAME`` flags: its ``flags``, else its folder's ``flags.flags``."""
        if self.flags is not None:
            return self.flags()
        flags = self._role("flags")
        if flags is None:
            raise ValueError(f"{self.name} has no diag command")
        return flags.flags

    def _has(self, role: str) -> bool:
        return self.home is not None and importlib.util.find_spec(f"{self.home}.{role}") is not None

    def _role(self, role: str) -> Any:
        return importlib.import_module(f"{self.home}.{role}") if self._has(role) else None

    def on(self, surface: str) -> bool:
        """Whether the check appears on ``surface`` (one of SURFACES)."""
        if surface == DIAG:
            return self.flags is not None or self._has("flags")
        if surface == CERTIFY:
            return self.certify is not None
        if surface == CONSOLE:
            return self.offer is not None
        raise ValueError(f"unknown surface {surface!r}: one of {', '.join(SURFACES)}")


_CHECKS: dict[str, Check] = {}
_FOUND: list[bool] = []  # the suite was scanned (discover() scans again)


def register(check: Check) -> Check:
    """Add ``check`` (a declaration found in the suite; a plugin or test adding its own)."""
    if check.name in _CHECKS:
        raise ValueError(f"check {check.name!r} is registered twice")
    _CHECKS[check.name] = check
    return check


def unregister(name: str) -> None:
    """Remove a registered check (a plugin or test that added one undoes it)."""
    _CHECKS.pop(name, None)


def discover() -> tuple[str, ...]:
    """Scan the suite's folders and register each one's ``CHECK`` not registered yet.

    Runs on the first use of the registry; call it again after a folder was added to
    the suite's path. Returns the names it added."""
    suite = importlib.import_module(SUITE)
    added = []
    for info in pkgutil.iter_modules(suite.__path__):
        if not info.ispkg:
            continue
        home = f"{SUITE}.{info.name}"
        check = replace(importlib.import_module(home).CHECK, home=home)
        if check.name.replace("-", "_") != info.name:
            raise ValueError(f"{home} declares {check.name!r}: name the folder after it")
        if _CHECKS.get(check.name) != check:
            added.append(register(check).name)
    _FOUND[:] = [True]
    return tuple(added)


def checks(surface: str | None = None) -> tuple[Check, ...]:
    """The registered checks, in their order (only those on ``surface``)."""
    if not _FOUND:
        discover()
    ordered = sorted(_CHECKS.values(), key=lambda c: (c.order, c.name))
    return tuple(c for c in ordered if surface is None or c.on(surface))


def names(surface: str | None = None) -> tuple[str, ...]:
    """The names of :func:`checks`."""
    return tuple(c.name for c in checks(surface))


def get(name: str) -> Check:
    """The check called ``name`` (KeyError naming the known ones)."""
    if not _FOUND:
        discover()
    try:
        return _CHECKS[name]
    except KeyError:
        raise KeyError(f"unknown check {name!r}: one of {', '.join(names())}") from None


def each(surface: str) -> Iterator[Check]:
    """Iterate the checks on ``surface``."""
    yield from checks(surface)


# ---- for the declarations' applicability rules -----------------------------------------------


def kind_name(s: Subject) -> str:
    """The subject's archetype as a rule's reason names it ("unknown" when not known)."""
    return s.archetype or "unknown"
