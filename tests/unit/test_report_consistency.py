"""Reports that agree with themselves (issue 45 item 5): every JSON report kind, in its
states, obeys the same invariants, checked by ONE test over all of them.

The documents: every check of the registry (opsctl.domain.check_registry) through
certify's entries (liveness, patches, engram, shutdown, and the checks' own reports
nested in them) and through its own recorded or stand-in documents (usage, invariance,
mm-uuid, kv-fail, lora: tests/data/gpu/ recordings and tests/standins/); and the other
documents: status, console --once, stacks (--merge), runs, patches, engram, certify,
version, error, each produced in its states by the CLI against stand-ins, or recorded.

The invariants (:func:`violations`), on the document and every object nested in it:

* ``schema`` is ``opsctl.<name>/<integer>``;
* ``timed_out`` is true exactly when the object's ``error`` (or ``reason``) says it timed
  out;
* an ``exit_code`` of 0 carries no ``error``, another says why;
* a ``verdict`` and an ``exit_code`` side by side agree (pass: 0; fail, inconclusive,
  error and the stacks' stuck/incomplete: not 0);
* a verdict matches its findings: a finding coded ``...inconclusive`` makes the verdict
  ``inconclusive``; a ``fail`` with findings has a failing one (or its reasons);
* a ``pass`` is never over a part that failed or was not judged: no finding of severity
  error, fail or critical, no nested object whose verdict is fail, error, inconclusive or unverified, no
  ``unread`` process;
* a verdict that is not pass says why (a reason, an error, a headline, a failing finding
  or part);
* the exit code the CLI gave agrees with the document: its ``exit_code`` when it has one;
  0 exactly for a pass (a check), a ready or busy server (status), an endpoint list all
  ready, busy or restarted (console).

The checks' exit rules (``outcome`` of the registry) agree with the verdicts of every
recorded document; for the five checks being reworked for issue 45 items 1-3 (kv-fail,
invariance, lora, mm-uuid, usage) what they still get wrong is marked xfail(strict=True)
with the finding, so the merge that fixes it flips it: an inconclusive verdict exits 1
but its line reads as a failure ("... failed: see report") and says nothing of what
would make it conclusive.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.domain import check_registry as reg

DATA = Path(__file__).resolve().parents[1] / "data"
SCHEMA = re.compile(r"^opsctl\.[a-z0-9_.-]+/[0-9]+$")
PASS = "pass"
NOT_PASSED = ("fail", "error", "inconclusive", "unverified", "stuck", "incomplete")
OK_STATES = {"status": ("ready", "busy"), "console": ("ready", "busy", "restarted")}
TIMEOUT = re.compile(r"timed out|timeout|(did not return|no answer) within|deadline", re.I)
FAILING = ("error", "fail", "critical")  # finding severities that fail a verdict
WHY = ("reason", "reasons", "error", "headline", "why", "failures", "detail")

Doc = tuple[str, dict, int | None]  # (what, document, the CLI's exit code or None)


# ---- the invariants ---------------------------------------------------------------------------


def _objects(doc: object, path: str = "$") -> Iterator[tuple[str, dict]]:
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            yield from _objects(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _objects(v, f"{path}[{i}]")


def _children(obj: dict) -> Iterator[dict]:
    for v in obj.values():
        for _, o in _objects(v):
            yield o


def _says_why(obj: dict) -> bool:
    if any(obj.get(k) for k in WHY):
        return True
    if any(f.get("severity") in ("error", "fail") for f in obj.get("findings") or ()):
        return True
    return any(c.get("verdict") in NOT_PASSED or c.get("reason") for c in _children(obj))


def object_violations(path: str, o: dict) -> list[str]:
    """What is inconsistent in one object of a document."""
    out = []
    if "timed_out" in o and isinstance(o["timed_out"], bool):
        text = " ".join(str(o.get(k) or "") for k in ("error", "reason"))
        if bool(TIMEOUT.search(text)) != o["timed_out"]:
            out.append(f"{path}: timed_out={o['timed_out']} but error/reason {text[:120]!r}")
    code = o.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        if code == 0 and o.get("error"):
            out.append(f"{path}: exit_code 0 with error {str(o['error'])[:80]!r}")
        if code != 0 and not _says_why(o):
            out.append(f"{path}: exit_code {code} says no why")
    verdict = o.get("verdict")
    if not isinstance(verdict, str):
        return out
    if isinstance(o.get("exit_code"), int) and (verdict == PASS) != (o["exit_code"] == 0):
        out.append(f"{path}: verdict {verdict} with exit_code {o['exit_code']}")
    findings = [f for f in o.get("findings") or () if isinstance(f, dict)]
    failing = [f.get("code") for f in findings if f.get("severity") in FAILING]
    undecided = [f.get("code") for f in findings if "inconclusive" in str(f.get("code"))]
    # an inconclusive comparison makes the verdict inconclusive, unless something else
    # failed (a fail dominates: e.g. the engine died on a seed whose comparison was unsure)
    failed_else = set(failing) - set(undecided)
    if undecided and verdict != "inconclusive" and not (verdict == "fail" and failed_else):
        out.append(f"{path}: verdict {verdict} with inconclusive findings {undecided}")
    if verdict == "fail" and findings and not failing and not undecided and not o.get("reasons"):
        out.append(f"{path}: fail with no failing finding (and no reasons)")
    if verdict == PASS:
        if failing:
            out.append(f"{path}: pass with failing findings {failing}")
        parts = [c.get("verdict") for c in _children(o) if c.get("verdict") in NOT_PASSED]
        if parts:
            out.append(f"{path}: pass over parts {sorted(set(parts))}")
        if o.get("unread"):
            out.append(f"{path}: pass with {len(o['unread'])} process(es) not read")
    elif verdict in NOT_PASSED and not _says_why(o):
        out.append(f"{path}: verdict {verdict} says no why")
    return out


def _cli_violations(doc: dict, code: int) -> list[str]:
    kind = doc["schema"].removeprefix("opsctl.").split("/")[0]
    if isinstance(doc.get("exit_code"), int) and doc["exit_code"] != code:
        return [f"exit {code} but the document's exit_code is {doc['exit_code']}"]
    if kind == "status":
        ok = doc.get("state") in OK_STATES["status"]
        return [] if ok == (code == 0) else [f"exit {code} with state {doc.get('state')}"]
    if kind == "console":
        states = [e["state"] for e in doc["endpoints"]]
        ok = bool(states) and all(s in OK_STATES["console"] for s in states)
        return [] if ok == (code == 0) else [f"exit {code} with endpoints {states}"]
    if isinstance(doc.get("verdict"), str) and (doc["verdict"] == PASS) != (code == 0):
        return [f"exit {code} with verdict {doc['verdict']}"]
    if kind == "error" and code == 0:
        return ["an error document with exit 0"]
    return []


def violations(doc: dict, code: int | None = None) -> list[str]:
    """Every inconsistency of ``doc`` (and of the CLI's exit ``code`` with it)."""
    out = [] if SCHEMA.match(str(doc.get("schema"))) else [f"schema {doc.get('schema')!r}"]
    for path, o in _objects(doc):
        out += object_violations(path, o)
    if code is not None and SCHEMA.match(str(doc.get("schema"))):
        out += _cli_violations(doc, code)
    return out


# ---- the documents ----------------------------------------------------------------------------

runner = CliRunner()


def cli(*args: str) -> Doc:
    r = runner.invoke(app, [*args, "--json"])
    assert r.stdout.strip(), (args, r.exit_code, r.stderr)
    return " ".join(args[:2]), json.loads(r.stdout), r.exit_code


@contextlib.contextmanager
def listening(accept: bool) -> Iterator[str]:
    """A bound port: listening and never answering (``accept``), or refusing."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        if accept:
            s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def status_docs() -> list[Doc]:
    from tests.standins.vllm_server import StandInFleet

    modes = ["healthy", "dead", "unauthorized", "notvllm", "stalled"]
    with StandInFleet(modes) as f:
        docs = [cli("status", u, "--timeout", "3s") for u in f.urls]
    with listening(False) as refused, listening(True) as hung:
        docs += [cli("status", refused), cli("status", hung, "--timeout", "1s")]
    return docs


def console_docs() -> list[Doc]:
    from tests.standins.vllm_server import StandInFleet

    fast = ("--once", "--no-discover", "--interval", "0.2s", "--stall-window", "1s")
    with StandInFleet(["healthy", "busy"]) as ok, StandInFleet(["stalled", "dead"]) as bad:
        docs = [cli("console", *ok.urls, *fast), cli("console", *bad.urls, *fast)]
    with listening(False) as refused:
        docs.append(cli("console", refused, *fast))
    return docs


def stacks_docs(tmp: Path) -> list[Doc]:
    frame = {"func": "run_busy_loop", "file": "vllm/v1/engine/core.py", "line": 912}
    read = {"pid": 7, "role": "EngineCore", "source": "signal", "state": "sleeping",
            "asleep": True, "moved": False,
            "threads": [{"ident": "0x1", "current": True, "frames": [frame]}]}  # fmt: skip
    unread = {"pid": 8, "role": "Worker_TP1", "source": "none", "state": "stopped",
              "error": "stopped: its stack handler (SIGUSR2) cannot run; py-spy is not "
              "installed (pip install py-spy)", "threads": []}  # fmt: skip
    docs = []
    for name, (a, b) in {"read": (read, {**read, "pid": 9, "role": "Worker_TP0"}),
                         "one-unread": (read, unread), "none-read": (unread, unread)}.items():  # fmt: skip
        files = []
        for host, p in (("node-a", a), ("node-b", b)):
            path = tmp / f"{name}-{host}.json"
            path.write_text(json.dumps({"schema": "opsctl.stacks/2", "host": host,
                                        "processes": [p]}))  # fmt: skip
            files.append(str(path))
        docs.append(cli("stacks", "--merge", *files))
    return docs


def certify_docs(tmp: Path, home: Path) -> list[Doc]:
    from tests.cli.test_certify_cli import invoke, standin
    from tests.standins.scoring import stand_in

    out = []
    with standin(home) as url:
        out.append(invoke(url, tmp=tmp))
    with standin(home, diverge=("fox", 3, 0.01)) as url:
        out.append(invoke(url, tmp=tmp))
    with stand_in(sleep=3.0) as url:
        out.append(invoke(url, "--checks", "usage", "--timeout", "1", tmp=tmp))
    with listening(False) as refused:
        out.append(invoke(refused, tmp=tmp))
    return [("certify", doc, r.exit_code) for r, doc, *_ in out]


def other_docs(tmp: Path, home: Path) -> list[Doc]:
    run = home / "runs" / "20260101-000000-serve-tiny-llama-8000"
    (run / "ledger").mkdir(parents=True)
    record = {"pid": 7, "role": "engine_core", "time": 1.0, "vllm_version": "0.32.0",
              "patches": [{"name": "engine_info_probe", "status": "applied", "detail": ""}]}  # fmt: skip
    (run / "ledger" / "7.json").write_text(json.dumps(record))
    (run / "meta.json").write_text(json.dumps({"url": "http://127.0.0.1:8000", "pid": 1}))
    docs = [cli("version"), cli("patches"), cli("runs", "list"), cli("runs", "clean"),
            cli("runs", "bundle", run.name, "--out", str(tmp / "b.tar.gz")),
            cli("engram", "plan", "--config", "deepseek-v4.1-flash", "--shm-size", "64G")]  # fmt: skip
    from tests.engram_tables import shared_table, unique_prefix

    prefix = unique_prefix("consistency")
    with shared_table(prefix, mappers=1):
        docs.append(cli("engram", "inspect", "--prefix", prefix))
    with listening(False) as refused, listening(True) as hung:
        docs.append(cli("diag", "usage", refused))  # the error document: unreachable
        docs.append(cli("status", hung, "--timeout", "1s"))
    return docs


def diag_docs(tmp: Path, check: str) -> list[Doc]:
    """A check's documents from its stand-ins (those that have one) and its recordings."""
    docs: list[Doc] = []
    if check == "usage":
        from tests.standins.scoring import stand_in

        with stand_in() as url:
            docs.append(cli("diag", "usage", url))
    if check == "mm-uuid":
        from tests.standins.mm_uuid import stand_in, write_run_dir

        write_run_dir(tmp)
        with stand_in(tmp) as url:
            docs.append(cli("diag", "mm-uuid", url, "--run", str(tmp)))
    kind = f"opsctl.diag.{check.replace('mm-uuid', 'mm_uuid')}/"
    return docs + [d for d in recorded() if d[1]["schema"].startswith(kind)]


def recorded() -> list[Doc]:
    """Every recorded opsctl document under tests/data (GPU runs, deaths), without a code."""
    out = []
    for p in sorted(DATA.rglob("*.json")):
        if "schemas" in p.parts:
            continue
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            doc = json.loads(p.read_text())
            for d in doc if isinstance(doc, list) else [doc]:
                if isinstance(d, dict) and str(d.get("schema", "")).startswith("opsctl."):
                    out.append((str(p.relative_to(DATA)), d, None))
    return out


def recorded_other() -> list[Doc]:
    diag = [f"opsctl.diag.{c.replace('mm-uuid', 'mm_uuid')}/" for c in FIVE]
    return [d for d in recorded() if not any(d[1]["schema"].startswith(k) for k in diag)]


# ---- the one test -----------------------------------------------------------------------------

# the checks helpers D and E rework for issue 45 items 1-3 (not edited here)
FIVE = ("usage", "invariance", "mm-uuid", "kv-fail", "lora")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


KINDS: dict[str, Callable[[Path, Path], list[Doc]]] = {
    "status": lambda tmp, home: status_docs(),
    "console": lambda tmp, home: console_docs(),
    "stacks": lambda tmp, home: stacks_docs(tmp),
    "certify": certify_docs,
    "others": other_docs,
    "recorded": lambda tmp, home: recorded_other(),
    **{f"check:{c}": functools.partial(lambda c, tmp, home: diag_docs(tmp, c), c) for c in FIVE},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_report_agrees_with_itself(kind, tmp_path, home):
    docs = KINDS[kind](tmp_path, home)
    assert docs, f"no {kind} document produced"
    found = {f"{what}: {v}" for what, doc, code in docs for v in violations(doc, code)}
    assert not found, "\n".join(sorted(found))


def _diag_name(schema: str) -> str | None:
    m = re.match(r"^opsctl\.diag\.([a-z_-]+)/", schema)
    return m.group(1).replace("mm_uuid", "mm-uuid") if m else None


def test_every_registered_check_has_documents_here():
    """Each check of the registry is in the corpus: its own diag documents, or its entries
    in certify's (liveness, patches, engram and shutdown run only there)."""
    seen = set()
    for _, doc, _ in recorded():
        seen.add(_diag_name(doc["schema"]))
        seen.update(c["check"] for c in doc.get("checks") or () if c.get("verdict") != "skipped")
    missing = {c.name for c in reg.checks()} - seen
    assert not missing, f"checks without a document here: {missing}"
    assert set(FIVE) <= {c.name for c in reg.checks() if c.parts().outcome}


def _report(check: str, doc: dict, verdict: str):
    """The check's own report type over ``doc``, its verdict set to ``verdict``."""
    return reg.get(check).parts().report(verdict, {**doc, "verdict": verdict})


def _outcome(check: str, report):
    """The check's exit rule (``outcome``) on ``report``, with its default options."""
    from opsctl.checks import registry as creg

    make = reg.get(check).parts().options
    return creg.outcome(check, report, make() if make else None)


def _recorded_of(check: str) -> list[dict]:
    return [d for _, d, _ in recorded() if _diag_name(d["schema"]) == check]


@pytest.mark.parametrize("check", FIVE)
def test_each_checks_exit_rule_agrees_with_its_recorded_verdicts(check):
    """A pass exits 0; a fail exits 1 (or 4 when it timed out), saying why."""
    docs = _recorded_of(check)
    assert docs, f"no recorded {check} document"
    for doc in docs:
        out = _outcome(check, _report(check, doc, doc["verdict"]))
        if doc["verdict"] == PASS:
            assert out.failure is None, (check, doc["verdict"], out.failure)
        else:
            assert out.failure is not None and int(out.failure.exit_code) in (1, 4), out
            assert str(out.failure).strip()


@pytest.mark.parametrize("check", FIVE)
def test_an_inconclusive_verdict_exits_1_and_says_it_is_inconclusive(check):
    """An inconclusive verdict is never a pass and never reads as a fail: exit 1, and the
    line says inconclusive (and, per issue 45, what would make it conclusive)."""
    doc = next(d for d in _recorded_of(check) if d["verdict"] == PASS)
    out = _outcome(check, _report(check, doc, "inconclusive"))
    assert out.failure is not None and int(out.failure.exit_code) == 1, out
    line = str(out.failure).lower()
    assert "inconclusive" in line and "failed" not in line, line


@pytest.mark.parametrize(
    "doc, code, says",
    [
        ({"schema": "opsctl.status/3", "error": "timed out after 5 s", "timed_out": False,
          "state": "unreachable"}, 3, "timed_out=False"),
        ({"schema": "opsctl.x/1", "verdict": "pass", "exit_code": 1}, None, "verdict pass"),
        ({"schema": "opsctl.x/1", "verdict": "pass", "items": [{"verdict": "inconclusive"}]},
         None, "pass over parts ['inconclusive']"),
        ({"schema": "opsctl.x/1", "verdict": "pass", "unread": [{"pid": 1}]}, None, "not read"),
        ({"schema": "opsctl.x/1", "verdict": "fail"}, None, "says no why"),
        ({"schema": "opsctl.x/1", "verdict": "fail", "findings": [
            {"severity": "error", "code": "kv_fail.comparison_inconclusive"}]}, None,
         "verdict fail with inconclusive findings"),
        ({"schema": "opsctl.x/1", "verdict": "pass", "findings": [{"severity": "fail"}]},
         None, "pass with failing findings"),
        ({"schema": "opsctl.x/1", "verdict": "pass"}, 1, "exit 1 with verdict pass"),
        ({"schema": "opsctl.console/4", "endpoints": [{"state": "stalled"}]}, 0, "exit 0"),
        ({"schema": "opsctl.x/0.32.0"}, None, "schema"),
        ({"schema": "opsctl.x/1", "exit_code": 0, "error": "boom"}, None, "exit_code 0 with"),
        ({"schema": "opsctl.x/1", "exit_code": 3, "error": None}, None, "says no why"),
    ],
)  # fmt: skip
def test_the_invariants_catch_what_they_name(doc, code, says):
    assert any(says in v for v in violations(doc, code)), violations(doc, code)
