"""The one diag command skeleton: every ``opsctl diag NAME``, built from its registration.

The registration is the check's ``CHECK`` (opsctl.domain.check_registry); the flags
function is the check's.

A check's flags function (``Check.flags``) declares only its own flags and turns them
into ``(target, options)``, refusing bad input (exit 2) before any engine starts. The
skeleton adds the flags every diag shares (``--json``, ``--tui/--no-tui``, and
``--api-key`` / the hidden ``--test-knob`` where the flags function takes them), runs
the check with its progress on stderr or in the live panel, prints the report (JSON or
the check's renderer), then applies the check's exit rule.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

from opsctl.commands import options
from opsctl.commands.options import (
    api_key_option,
    json_option,
    rank_option,
    test_knob_option,
    tui_option,
)
from opsctl.domain import check_registry as reg

# the shared flags: (name, annotation, typer declaration), in --help order after the check's
SHARED: tuple[tuple[str, Any, Callable[[], Any]], ...] = (
    ("tp", int | None, lambda: rank_option("tp")),
    ("dp", int | None, lambda: rank_option("dp")),
    ("as_json", bool, json_option),
    ("tui", bool | None, tui_option),
    ("api_key", str | None, api_key_option),
    ("test_knob", list[str] | None, test_knob_option),
)
# taken by the skeleton, never by a flags function: every diag can start its engine with
# ranks (--tp/--dp, applied to the target the flags function returns)
RUN_BY_SKELETON = ("tp", "dp", "as_json", "tui")


def default_model(check: reg.Check) -> str | None:
    """The model the check starts when ``--model`` is not given (its ``DEFAULT_MODEL``)."""
    return check.parts().default_model


def with_ranks(target: Any, tp: int | None, dp: int | None, model: str | None) -> Any:
    """The flags function's target with ``--tp``/``--dp`` (refused now when they cannot run)."""
    from opsctl.checks.target import with_ranks as ranked

    return ranked(target, tp, dp, model)


def signature(flags: Callable[..., Any]) -> inspect.Signature:
    """The command's signature: the flags function's own flags, then the shared ones.

    ``--json`` and ``--tui`` always; ``--api-key``, ``--test-knob`` where it takes them."""
    own = inspect.signature(flags).parameters  # its return type may be TYPE_CHECKING-only
    shared = {name: (ann, make) for name, ann, make in SHARED}
    params = [
        p.replace(annotation=eval(p.annotation, flags.__globals__))
        if isinstance(p.annotation, str)
        else p
        for p in own.values()
        if p.name not in shared
    ]
    for name, (ann, make) in shared.items():
        if name in own or name in RUN_BY_SKELETON:
            kind = inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(name, kind, default=make(), annotation=ann))
    return inspect.Signature(params, return_annotation=None)


def command(check: reg.Check) -> Callable[..., None]:
    """The ``opsctl diag NAME`` function Typer registers for ``check``."""
    flags = check.diag_flags()

    def diag(**kwargs: Any) -> None:
        as_json, tui = kwargs.pop("as_json"), kwargs.pop("tui")
        tp, dp = kwargs.pop("tp"), kwargs.pop("dp")
        target, options = flags(**kwargs)
        target = with_ranks(target, tp, dp, default_model(check))
        run_diag(check, target, options, tui=tui, as_json=as_json)

    diag.__signature__ = signature(flags)  # type: ignore[attr-defined]
    diag.__doc__ = flags.__doc__
    diag.__name__ = flags.__name__
    return diag


def run_diag(
    check: reg.Check, target: Any, options: Any, *, tui: bool | None, as_json: bool
) -> None:
    """Run ``check`` on ``target``, print its report, exit by its rule (raises)."""
    from opsctl import output
    from opsctl.checks import registry
    from opsctl.ui.progress import run_with_progress

    parts = check.parts()
    run = parts.run
    assert run is not None, check.name
    report = run_with_progress(
        f"diag {check.name}",
        lambda progress: run(target, options, progress),
        tui=tui,
        as_json=as_json,
    )
    said = registry.outcome(check.name, report, options)
    for line in said.info:
        output.info(line)
    for line in said.warnings:
        output.warn(line)
    doc = report.to_dict()
    draw = parts.render
    output.emit(doc, as_json=as_json, render=lambda con: draw(con, doc) if draw else None)
    for line in said.after:
        output.warn(line)
    if said.failure is not None:
        raise said.failure


def register(app: typer.Typer) -> None:
    """Add ``opsctl diag NAME`` for every registered check with a diag command."""
    for check in reg.checks(reg.DIAG):
        options.command(app, check.name, check.summary, *check.examples)(command(check))
