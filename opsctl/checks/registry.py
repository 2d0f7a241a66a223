"""The registered checks' parts as calls, with the typed arguments every part takes.

The declarations are the folders of :mod:`opsctl.suite` (one :class:`Check` each,
:mod:`opsctl.domain.check_registry`); this module holds what their parts are called
with: :class:`CertifyContext` (certify's shared session and facts), :class:`ServerRef`
(a console's server), :class:`Outcome` (what a diag command says and the error it exits
with), and certify's engine planning, :class:`Planning` in, :class:`Need` out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.domain import check_registry as reg
from opsctl.errors import BadInput, OpsctlError

if TYPE_CHECKING:
    from opsctl.checks.session import EngineSession
    from opsctl.checks.target import EngineSpec, Target, UrlTarget


@dataclass
class CertifyContext:
    """What a check run by certify gets: its target, the shared session, the facts."""

    target: Target
    timeout: float
    facts: Any  # opsctl.checks.certify_plan.Facts (the model, its kind, its run)
    session: EngineSession
    settings: dict[str, Any] = field(default_factory=dict)  # per-check options certify set


@dataclass(frozen=True)
class ServerRef:
    """A running server a check is run on from the console."""

    url: UrlTarget
    run_dir: Path | None = None  # its opsctl run directory, when it has one
    model: str | None = None  # the model it serves (name or directory), when known


@dataclass(frozen=True)
class Outcome:
    """What a diag command says after its report, and the error it exits with."""

    info: tuple[str, ...] = ()  # stderr lines before the report
    warnings: tuple[str, ...] = ()  # stderr warnings before the report
    after: tuple[str, ...] = ()  # stderr warnings after the report
    failure: OpsctlError | None = None  # raised after the report (exit 1 or 4)


@dataclass(frozen=True)
class Planning:
    """What certify plans a managed run's engines from (its engine specs, nothing started).

    ``base``: the engine the command line names; ``common``: the settings every engine of
    the run shares (``base`` through each certify check's ``shared_base``); ``main``: the
    engine the checks share (``common`` through each check's ``shared_engine``, the last
    in certify's order first, so the first check has the last word on it)."""

    base: EngineSpec
    subject: reg.Subject
    common: EngineSpec
    main: EngineSpec
    options: Mapping[str, Any] = field(default_factory=dict)  # each check's, by name


@dataclass(frozen=True)
class Need:
    """The engine a check is called with under certify, and every engine it opens."""

    target: EngineSpec
    specs: tuple[EngineSpec, ...]


def _part(check: reg.Check, what: str) -> Any:
    part = getattr(check.parts(), what)
    if part is None:
        raise BadInput(f"{check.name} has no {what.replace('_', ' ')}")
    return part


def certify_run(name: str, ctx: CertifyContext, progress: ev.Progress) -> Any:
    """Run check ``name`` as certify does: its report."""
    return _part(reg.get(name), "certify")(ctx, progress)


def server_call(name: str, server: ServerRef) -> Callable[[ev.Progress], Any]:
    """``call(progress) -> report`` running check ``name`` on ``server``.

    BadInput now when a check for servers opsctl started has no model to start its own
    engine with."""
    check = reg.get(name)
    run = _part(check, "on_server")
    if check.offer is not None and check.offer.opsctl_started and not server.model:
        raise BadInput(f"no model known for {server.url.url}: {name} needs the run's model")
    return lambda progress: run(server, progress)


def outcome(name: str, report: Any, options: Any) -> Outcome:
    """The exit rule of check ``name`` applied to its report."""
    return _part(reg.get(name), "outcome")(report, options)
