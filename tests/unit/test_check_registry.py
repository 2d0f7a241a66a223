"""Every check is one typed declaration in its own folder (opsctl/suite/<name>/, found by
opsctl.domain.check_registry) and every surface derives from it: each registered check
is reachable from every surface it declares (``opsctl diag NAME --help``, certify's
selection and engine plan, the console's offer, the README's table), finding the checks
loads none of their code, and a toy check that this module writes as one new folder (and
nothing else) appears on all of them: in ``--help``, run by ``opsctl diag toy`` and by
``opsctl certify --checks toy`` against a stand-in server, in certify's engine plan,
offered by the console, and flagged by the README check until the README lists it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from opsctl.checks import registry as parts
from opsctl.checks.target import UrlTarget
from opsctl.console import judge as c
from opsctl.console.judge_state import EndpointTracker
from opsctl.domain import certify as cert
from opsctl.domain import check_registry as reg
from tests.standins.completions import Behaviour, completions_server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "docs" / "reference.md"  # the generated command reference
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


# what each surface calls of a check's parts
NEEDED = {
    reg.DIAG: ("run", "outcome", "report"),
    reg.CERTIFY: ("certify",),
    reg.CONSOLE: ("on_server",),
}


def test_every_check_has_the_parts_its_surfaces_call():
    for check in reg.checks():
        loaded = check.parts()
        assert callable(loaded.report), check.name
        for surface, needed in NEEDED.items():
            if check.on(surface):
                missing = [p for p in needed if not callable(getattr(loaded, p))]
                assert not missing, (check.name, surface, missing)
        if check.on(reg.DIAG):
            assert callable(check.diag_flags()) and loaded.schema, check.name


def test_every_declared_schema_has_its_schema_file():
    schemas = ROOT / "tests" / "data" / "schemas"
    for check in reg.checks(reg.DIAG):
        name, _, version = check.parts().schema.partition("/")
        assert (schemas / f"opsctl.{name}-{version}.schema.json").is_file(), check.name


def test_finding_the_checks_loads_none_of_their_code():
    """The declarations are pure: listing every check (what ``--help`` and certify's
    selection do first) imports no layer above the domain and nothing heavy."""
    code = (
        "import sys, json\nfrom opsctl.domain import check_registry as reg\n"
        "reg.checks()\nprint(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mods = json.loads(out.stdout)
    assert {m for m in mods if m.startswith("opsctl.suite.")} >= {"opsctl.suite.usage"}
    upper = ("opsctl.checks", "opsctl.commands", "opsctl.ui", "opsctl.collectors", "opsctl.engine")
    heavy = ("typer", "textual", "rich", "httpx", "psutil", "torch", "vllm")
    assert not [m for m in mods if m.startswith(upper) or m.split(".")[0] in heavy]


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


# ---- a toy check: one new folder, nothing else ------------------------------------------------

TOY = {
    "__init__.py": """
        \"\"\"toy: a toy check written by the registry's test (its declaration).\"\"\"

        from opsctl.domain.check_registry import GENERATIVE, Check, Offer

        CHECK = Check(
            "toy",
            "toy: the registry's test check",
            "A toy check registered by the registry's test.",
            order=75,
            certify=lambda s: None if s.generative else "toy: needs a generative model",
            offer=Offer(GENERATIVE, "the toy"),
            examples=("opsctl diag toy 127.0.0.1:8000",),
        )
    """,
    "run.py": """
        \"\"\"The toy's library call: a report naming its target.\"\"\"

        from opsctl.checks.registry import Outcome
        from opsctl.checks.report import Report
        from opsctl.errors import CheckFailed

        SCHEMA = "toy/1"


        def _report(verdict, target):
            doc = {"schema": "opsctl.toy/1", "verdict": verdict, "target": target}
            return Report(verdict, doc)


        def run(target, fail, progress):
            return _report("fail" if fail else "pass", target)


        def certify(ctx, progress):
            return _report("pass", getattr(ctx.target, "url", "a model"))


        def on_server(server, progress):
            return _report("pass", server.url.url)


        def outcome(report, options):
            failure = CheckFailed("the toy failed") if report.verdict == "fail" else None
            return Outcome(info=("toy ran",), failure=failure)
    """,
    "flags.py": """
        \"\"\"opsctl diag toy's flags.\"\"\"

        import typer


        def flags(
            url: str = typer.Argument(..., help="the server"),
            fail: bool = typer.Option(False, "--fail", help="make the toy fail"),
        ) -> tuple[str, bool]:
            \"\"\"Say whether a server answered the toy (a toy check for the registry's test).\"\"\"
            return url, fail
    """,
    "view.py": """
        \"\"\"The toy's text renderer.\"\"\"


        def render(console, doc):
            console.print(f"TOY {doc['verdict']} on {doc['target']}")
    """,
}


def _git_status() -> str | None:
    if not (ROOT / ".git").exists():
        return None
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", "opsctl", "engine_patches"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout if out.returncode == 0 else None


@pytest.fixture
def toy(tmp_path):
    """The toy check: one folder written into the suite's path, and nothing else."""
    import opsctl.suite

    before = _git_status()
    folder = tmp_path / "toy"
    folder.mkdir()
    written = set()
    for name, text in TOY.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
        written.add(folder / name)
    opsctl.suite.__path__.append(str(tmp_path))
    try:
        assert reg.discover() == ("toy",)
        yield written
    finally:
        opsctl.suite.__path__.remove(str(tmp_path))
        reg.unregister("toy")
        for m in [
            m for m in sys.modules if m == "opsctl.suite.toy" or m.startswith("opsctl.suite.toy.")
        ]:
            del sys.modules[m]
    assert "toy" not in reg.names()
    assert {p.parent for p in written} == {folder}  # every file it wrote: in the toy's folder
    assert _git_status() == before  # and no file of the product edited


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
    r = runner.invoke(app(), ["certify", "--help"])  # certify's list of checks names it too
    assert re.search(r"kv-fail,\s+toy,\s+shutdown;", r.stdout), r.stdout


def test_a_toy_check_is_certified_planned_offered_and_flagged_by_the_readme_check(toy):
    from tests.unit.test_certify_plan_pinned import plan_of

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

    # certify's engine plan: the toy declares no engine, so it runs on the shared one
    toy_plan, alone = (
        plan_of("tiny-llama", ("toy",), "default"),
        plan_of("tiny-llama", ("liveness",), "default"),
    )
    assert toy_plan["targets"]["toy"] == alone["targets"]["liveness"]
    assert toy_plan["specs"] == alone["specs"]

    from opsctl.console import actions as act

    offered = {x.name: x.why for x in act.applicable(view(), ours=False)}
    assert offered["toy"].startswith("the toy;")
    job = parts.server_call("toy", parts.ServerRef(UrlTarget("http://127.0.0.1:9")))
    assert job(lambda e: None).verdict == "pass"

    assert readme_gaps(README.read_text(encoding="utf-8")) == ["diag toy", "certify toy"]
