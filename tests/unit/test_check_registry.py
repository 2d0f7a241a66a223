"""Every check is declared once (opsctl.domain.check_registry) and every surface derives
from that declaration: each registered check is reachable from every surface it declares
(``opsctl diag NAME --help``, certify's selection, the console's offer, the README's
table), and a toy check that this module registers (its parts are this module's own
functions, plus one ``register`` call) appears on all of them: in ``--help``, run by
``opsctl diag toy`` and by ``opsctl certify --checks toy`` against a stand-in server,
offered by the console, and flagged by the README check until the README lists it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from opsctl.checks import registry as parts
from opsctl.checks.target import UrlTarget
from opsctl.domain import certify as cert
from opsctl.domain import check_registry as reg
from opsctl.domain import console as c
from opsctl.domain.console_state import EndpointTracker
from opsctl.errors import CheckFailed
from tests.standins.completions import Behaviour, completions_server

README = Path(__file__).resolve().parents[2] / "docs" / "reference.md"  # the generated command reference
runner = CliRunner()


def readme_gaps(text: str) -> list[str]:
    """The README check: each diag check needs a `| `opsctl diag NAME` row in the command
    table, each certify check a place in certify's row's list of checks."""
    rows = [ln for ln in text.splitlines() if ln.startswith("| `opsctl")]
    gaps = [
        f"diag {n}"
        for n in reg.names(reg.DIAG)
        if not any(r.startswith(f"| `opsctl diag {n} ") or r.startswith(f"| `opsctl diag {n}`")
                   for r in rows)
    ]  # fmt: skip
    certify_row = next(r for r in rows if r.startswith("| `opsctl certify"))
    listed = re.search(r"every applicable check in one run \(([^)]*)\)", certify_row)
    in_row = {s.strip() for s in listed.group(1).split(",")} if listed else set()
    gaps += [f"certify {n}" for n in reg.names(reg.CERTIFY) if n not in in_row]
    return gaps


def app() -> typer.Typer:
    from opsctl.cli import build_app

    return build_app()  # built now: after any registration of this test


def view(models=()) -> c.EndpointView:
    from dataclasses import replace

    v = EndpointTracker(c.Target("n", "http://127.0.0.1:1", "argument")).view
    return replace(v, info=c.EngineInfo("0.32.0", tuple(models)))


# ---- every registered check, every surface ------------------------------------------------


def test_the_registry_holds_every_check_once_in_certify_order():
    names = reg.names()
    assert len(names) == len(set(names)) >= 9
    assert cert.certify_checks() == reg.names(reg.CERTIFY)
    assert reg.names(reg.CERTIFY)[0] == "liveness" and reg.names(reg.CERTIFY)[-1] == "shutdown"
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(reg.get("usage"))


def test_every_part_path_resolves_to_a_callable():
    for check in reg.checks():
        for what in ("report", "certify_run", "server_run", "run", "diag", "outcome", "render"):
            path = getattr(check, what)
            if path is not None:
                assert callable(parts.resolve(path)), (check.name, what, path)


@pytest.mark.parametrize("name", reg.names(reg.DIAG))
def test_every_diag_check_has_a_command_with_its_summary(name):
    r = runner.invoke(app(), ["diag", "--help"])
    assert r.exit_code == 0
    assert re.search(rf"^\s*│?\s*{re.escape(name)}\s", r.stdout, re.M), r.stdout
    r = runner.invoke(app(), ["diag", name, "--help"])
    assert r.exit_code == 0, r.output
    assert "--json" in r.stdout and "--tui" in r.stdout


def test_every_certify_check_is_selected_where_it_applies():
    everything = reg.Subject(
        managed=True, model="m", archetype="vision-language", run_dir=True, local=True
    )
    sel = cert.select(everything)
    # usage needs a pooling model: every other certify check applies to this subject
    assert set(sel.run) | {"usage"} == set(reg.names(reg.CERTIFY)), sel
    pooling = reg.Subject(managed=True, model="m", archetype="cross-encoder", run_dir=True)
    assert "usage" in cert.select(pooling).run


def test_every_console_check_is_offered_on_a_server_of_unknown_kind():
    from opsctl.console import actions as act

    assert [x.name for x in act.applicable(view(), ours=True)] == list(reg.names(reg.CONSOLE))


def test_the_readme_lists_every_check():
    assert readme_gaps(README.read_text(encoding="utf-8")) == []


# ---- a toy check: its own parts (below) and one registration --------------------------------


@dataclass
class ToyReport:
    """The toy's report: verdict and a schema-versioned document."""

    verdict: str
    target: str

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "opsctl.toy/1", "verdict": self.verdict, "target": self.target}


def toy_flags(
    url: str = typer.Argument(..., help="the server"),
    fail: bool = typer.Option(False, "--fail", help="make the toy fail"),
) -> tuple[str, bool]:
    """Say whether a server answered the toy (a toy check for the registry's test)."""
    return url, fail


def toy_run(target: str, fail: bool, progress) -> ToyReport:
    """The toy's diag run: a report naming the target."""
    return ToyReport("fail" if fail else "pass", target)


def toy_outcome(report: ToyReport, options: bool) -> parts.Outcome:
    """The toy's exit rule: exit 1 on a failing verdict."""
    failure = CheckFailed("the toy failed") if report.verdict == "fail" else None
    return parts.Outcome(info=("toy ran",), failure=failure)


def toy_render(console, doc: dict[str, Any]) -> None:
    """The toy's text renderer."""
    console.print(f"TOY {doc['verdict']} on {doc['target']}")


def toy_certify(ctx: parts.CertifyContext, progress) -> Any:
    """The toy as certify runs it, on certify's target."""
    from opsctl.checks.report import Report

    url = getattr(ctx.target, "url", "a model")
    return Report("pass", {"schema": "opsctl.toy/1", "verdict": "pass", "target": url})


def toy_on_server(server: parts.ServerRef, progress) -> ToyReport:
    """The toy on a console's server."""
    return ToyReport("pass", server.url.url)


HERE = "tests.unit.test_check_registry"


@pytest.fixture
def toy():
    check = reg.register(
        reg.Check(
            "toy",
            "toy: the registry's test check",
            "A toy check registered by the registry's test.",
            report=f"{HERE}:ToyReport",
            certify=lambda s: None if s.generative else "toy: needs a generative model",
            certify_run=f"{HERE}:toy_certify",
            offer=reg.Offer(reg.GENERATIVE, "the toy"),
            server_run=f"{HERE}:toy_on_server",
            run=f"{HERE}:toy_run",
            diag=f"{HERE}:toy_flags",
            outcome=f"{HERE}:toy_outcome",
            render=f"{HERE}:toy_render",
            examples=("opsctl diag toy 127.0.0.1:8000",),
        )
    )
    try:
        yield check
    finally:
        reg.unregister("toy")
    assert "toy" not in reg.names()


def test_a_toy_check_appears_in_help_and_runs_as_a_diag(toy):
    r = runner.invoke(app(), ["diag", "--help"])
    assert "toy" in r.stdout and "A toy check registered" in r.stdout
    r = runner.invoke(app(), ["diag", "toy", "--help"])
    assert "--fail" in r.stdout and "--json" in r.stdout and "opsctl diag toy 127.0.0.1" in r.stdout
    r = runner.invoke(app(), ["diag", "toy", "127.0.0.1:9", "--no-tui"])
    assert r.exit_code == 0, r.output
    assert "TOY pass on 127.0.0.1:9" in r.stdout
    r = runner.invoke(app(), ["diag", "toy", "127.0.0.1:9", "--fail", "--json"])
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout) == {"schema": "opsctl.toy/1", "verdict": "fail",
                                    "target": "127.0.0.1:9"}  # fmt: skip


def test_a_toy_check_is_certified_offered_and_flagged_by_the_readme_check(toy, tmp_path):
    decoder = reg.Subject(managed=False, model="m", archetype="decoder")
    assert "toy" in cert.select(decoder).run
    assert cert.skip_reason("toy", reg.Subject(False, "m", "cross-encoder")) is not None
    assert cert.title("toy") == "toy: the registry's test check"
    with completions_server(Behaviour()) as (url, _):
        r = runner.invoke(app(), ["certify", url, "--checks", "toy", "--json"])
    doc = json.loads(r.stdout)
    rows = {ch["check"]: ch for ch in doc["checks"]}
    assert rows["toy"]["verdict"] == "pass", r.output
    assert r.exit_code == 0, r.output

    from opsctl.console import actions as act

    offered = {x.name: x.why for x in act.applicable(view(), ours=False)}
    assert offered["toy"].startswith("the toy;")
    job = parts.server_call("toy", parts.ServerRef(UrlTarget("http://127.0.0.1:9")))
    assert job(lambda e: None).verdict == "pass"

    assert readme_gaps(README.read_text(encoding="utf-8")) == ["diag toy", "certify toy"]
