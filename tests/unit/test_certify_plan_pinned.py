"""certify's engine plans, pinned: for every embedded model and every check selection
(certify's default set, and each applicable check alone, in both invariance modes) the
target each check is called with and every engine spec certify registers with its
session are the ones recorded in tests/data/certify_engine_plans.json.

The engine tests (tests/e2e) start exactly these engines; a change to how certify plans
its engines must show here first. Recorded with ``python -m tests.unit.test_certify_plan_pinned``
(it rewrites the file: review the diff)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from opsctl.checks import certify
from opsctl.checks import certify_plan as planning
from opsctl.checks.target import EngineSpec
from opsctl.domain import certify as dom
from opsctl.embedded import catalog

PINNED = Path(__file__).resolve().parents[1] / "data" / "certify_engine_plans.json"
MODES = ("default", "eager")


def _spec(spec: Any) -> Any:
    if not isinstance(spec, EngineSpec):
        return repr(spec)
    d = asdict(spec)
    d["probes"] = sorted(spec.probes)
    return json.loads(json.dumps(d))  # as the pinned file holds it (tuples are lists)


class _Recording(certify.CertifySession):
    def __init__(self) -> None:
        super().__init__()
        self.planned: list[EngineSpec] = []

    def plan(self, specs: list[EngineSpec]) -> int:
        self.planned.extend(specs)
        return super().plan(specs)


def selections(subject: dom.Subject) -> list[tuple[str, ...]]:
    """certify's default selection, then each applicable check alone."""
    default = dom.select(subject).run
    alone = [(c,) for c in dom.certify_checks() if dom.skip_reason(c, subject) is None]
    return [default, *alone]


def plan_of(model: str, checks: tuple[str, ...], mode: str) -> dict[str, Any]:
    """What certify plans for ``checks`` on ``model`` (nothing started)."""
    target = EngineSpec(model=model)
    options = certify.Options(checks=checks, invariance_mode=mode)
    facts = planning.managed_facts(target)
    selection = dom.select(facts.subject, checks)
    session = _Recording()
    job = certify._Job(target, options, facts, selection, session, lambda e: None)
    return {
        "targets": {c: _spec(t) for c, t in sorted(job.targets.items())},
        "specs": [_spec(s) for s in session.planned],
    }


def cases() -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for model in catalog.CATALOG:
        subject = planning.managed_facts(EngineSpec(model=model)).subject
        for checks in selections(subject):
            out.extend((model, mode, checks) for mode in MODES)
    return out


def key(model: str, mode: str, checks: tuple[str, ...]) -> str:
    return f"{model} {mode} {','.join(checks)}"


def record() -> dict[str, Any]:
    return {key(*case): plan_of(case[0], case[2], case[1]) for case in cases()}


def test_every_case_is_pinned_and_no_pin_is_stale():
    pinned = json.loads(PINNED.read_text())
    assert sorted(pinned) == sorted(key(*c) for c in cases())


@pytest.mark.parametrize("model", sorted(catalog.CATALOG))
def test_certify_plans_the_pinned_engines(model):
    pinned = json.loads(PINNED.read_text())
    for m, mode, checks in cases():
        if m == model:
            assert plan_of(model, checks, mode) == pinned[key(m, mode, checks)], key(
                m, mode, checks
            )


if __name__ == "__main__":
    PINNED.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
