"""The registered checks' parts, resolved: how each runs from certify and on a server,
and its exit rule.

The declarations are :mod:`opsctl.domain.check_registry` (one per check); this module
turns their ``module:attribute`` paths into calls, with the typed arguments every part
takes: :class:`CertifyContext` (certify's shared session and facts),
:class:`ServerRef` (a console's server) and :class:`Outcome` (what a diag command says
and the error it exits with).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.domain import check_registry as reg
from opsctl.errors import BadInput, OpsctlError

if TYPE_CHECKING:
    from opsctl.checks.session import EngineSession
    from opsctl.checks.target import Target, UrlTarget


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


def resolve(path: str) -> Any:
    """The object at ``module:attribute``."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def _part(check: reg.Check, what: str) -> Any:
    path = getattr(check, what)
    if path is None:
        raise BadInput(f"{check.name} has no {what.replace('_', ' ')}")
    return resolve(path)


def certify_run(name: str, ctx: CertifyContext, progress: ev.Progress) -> Any:
    """Run check ``name`` as certify does: its report."""
    return _part(reg.get(name), "certify_run")(ctx, progress)


def server_call(name: str, server: ServerRef) -> Callable[[ev.Progress], Any]:
    """``call(progress) -> report`` running check ``name`` on ``server`` (BadInput now
    when a check for servers opsctl started has no model to start its own engine with)."""
    check = reg.get(name)
    run = _part(check, "server_run")
    if check.offer is not None and check.offer.opsctl_started and not server.model:
        raise BadInput(f"no model known for {server.url.url}: {name} needs the run's model")
    return lambda progress: run(server, progress)


def outcome(name: str, report: Any, options: Any) -> Outcome:
    """The exit rule of check ``name`` applied to its report."""
    return _part(reg.get(name), "outcome")(report, options)
