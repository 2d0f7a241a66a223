"""`opsctl certify` over a fleet without a real engine (stand-ins: tests/standins/fleet.py,
tests/standins/completions.py): bad input in the targets file (a bad URL, a name given
twice, one server twice, an unset ``api_key_env`` variable, --model beside targets) is
one error line, exit 2 and no file written; a fleet of two passing stand-ins, a hung
one and a closed port: exit 1, ONE JUnit file (valid against junit-10.xsd, a testsuite
per target), ONE SARIF log (valid SARIF 2.1.0, a run per target), the JSON verdicts,
in the wall time of the deadline; the library call's events and its concurrency bound
(a hung target's slot is freed at its deadline). The e2e with real engines is
tests/e2e/test_certify_fleet_e2e.py."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from typer.testing import CliRunner

from opsctl.checks import certify
from opsctl.checks import certify_fleet as fleet
from opsctl.checks import events as ev
from opsctl.cli import app
from opsctl.domain.certify_fleet import FleetTarget
from opsctl.engine.server import free_port
from tests.standins.completions import Behaviour, completions_server
from tests.standins.fleet import KEY, hung_server, keyed_server, slow_server

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
DEADLINE_S = 6  # each target's --timeout: liveness on a stand-in finishes inside it on busy cores


@contextlib.contextmanager
def closed_port():
    yield f"http://127.0.0.1:{free_port()}"  # nobody listens there


def run_cli(args: list[str], tmp: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    out = ["--json", "--junit", "ci/fleet.xml", "--sarif", "ci/fleet.sarif"]
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "certify", *args, *out],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,
        env={**os.environ, **(env or {})},
    )


BAD = [
    ('[[targets]]\nname = "a"\nurl = "http://127.0.0.1:notaport"\n', [], "not a valid URL"),
    (
        '[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8001"\n'
        '[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8002"\n',
        [],
        "target name 'a' is given twice",
    ),
    (
        '[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8001"\n'
        '[[targets]]\nname = "b"\nurl = "http://localhost:8001"\n',
        [],
        "targets a and b are the same server (127.0.0.1:8001)",
    ),
    (
        '[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8001"\n'
        'api_key_env = "OPSCTL_TEST_UNSET_KEY"\n',
        [],
        "target 'a': its api_key_env variable OPSCTL_TEST_UNSET_KEY is not set",
    ),
    (
        '[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8001"\n',
        ["--model", "tiny-llama"],
        "--model, --tp, --dp and --test-knob certify one engine",
    ),
    ("[[targets]\n", [], "is not valid TOML"),
]


@pytest.mark.parametrize(
    ("toml", "extra", "text"),
    BAD,
    ids=["bad-url", "duplicate-name", "same-server", "unset-key-env", "model", "bad-toml"],
)
def test_bad_targets_file_is_one_line_exit_2_nothing_written(toml, extra, text, tmp_path):
    (tmp_path / "fleet.toml").write_text(toml)
    r = run_cli(["--targets", "fleet.toml", *extra], tmp_path)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert len(errors) == 1 and text in errors[0], r.stderr
    assert len([x for x in r.stderr.splitlines() if not x.startswith("hint:")]) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "ci").exists()  # no JUnit, no SARIF, not even their directory


def test_two_urls_one_bad_is_exit_2_nothing_written(tmp_path):
    with completions_server(Behaviour()) as (url, _):
        r = run_cli([url, "http://256.1.1.1:9"], tmp_path)
    assert r.returncode == 2 and "not a valid URL" in r.stderr, r.stderr
    assert not (tmp_path / "ci").exists()


def test_fleet_of_standins_one_junit_one_sarif_json_verdicts(tmp_path):
    with (
        completions_server(Behaviour()) as (a, _),
        keyed_server() as keyed,
        hung_server() as hung,
        closed_port() as dead,
    ):
        (tmp_path / "fleet.toml").write_text(
            f'[[targets]]\nname = "a"\nurl = "{a}"\nlabels = {{ role = "decode" }}\n'
            f'[[targets]]\nname = "keyed"\nurl = "{keyed}"\napi_key_env = "FLEET_KEY"\n'
            f'[[targets]]\nname = "hung"\nurl = "{hung}"\n'
        )
        t0 = time.monotonic()
        out = ["--json", "--junit", str(tmp_path / "ci/fleet.xml")]
        out += ["--sarif", str(tmp_path / "ci/fleet.sarif")]
        r = CliRunner().invoke(
            app,
            ["certify", "--targets", str(tmp_path / "fleet.toml"), dead, *out,
             "--timeout", f"{DEADLINE_S}s", "--checks", "liveness"],
            env={"FLEET_KEY": KEY},
        )  # fmt: skip
        took = time.monotonic() - t0
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.certify.fleet/1" and doc["exit_code"] == 1
    dead_name = dead.removeprefix("http://")
    verdicts = {t["name"]: (t["verdict"], t["state"]) for t in doc["targets"]}
    # the hung one: its deadline, or its first contact's HTTP timeout (the same length)
    hung_state = verdicts["hung"][1]
    assert hung_state in ("deadline", "unreachable")
    assert verdicts == {
        "a": ("pass", "ran"), "keyed": ("pass", "ran"),
        "hung": ("fail", hung_state), dead_name: ("fail", "unreachable"),
    }  # fmt: skip
    assert (doc["summary"]["passed"], doc["summary"]["failed"]) == (2, 2)
    by = {t["name"]: t for t in doc["targets"]}
    assert by["a"]["labels"] == {"role": "decode"}
    assert by["a"]["fingerprint"]["model"]["name"] == "stand-in-llama"
    assert by["keyed"]["fingerprint"]["vllm_version"] == "0.0-standin"
    # the hung target's deadline: the others finish long before it, the run with it
    assert max(by["a"]["duration_s"], by["keyed"]["duration_s"]) < DEADLINE_S
    assert took < DEADLINE_S + 5
    # JUnit: valid, one testsuite per target; the dead and hung ones fail liveness
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(tmp_path / "ci/fleet.xml"))
    root = ET.parse(tmp_path / "ci" / "fleet.xml").getroot()
    suites = {s.find("properties/property[@name='target']").get("value"): s for s in root}
    assert set(suites) == {"a", "keyed", "hung", dead_name}
    for name in ("hung", dead_name):
        failure = suites[name].find("testcase[@name='liveness']/failure")
        assert failure is not None and failure.get("type").startswith("liveness.")
    assert {n for n, s in suites.items() if s.get("failures") != "0"} == {"hung", dead_name}
    # SARIF: valid, one run per target, distinct automation ids
    log = json.loads((tmp_path / "ci" / "fleet.sarif").read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    runs = {run["properties"]["target"]: run for run in log["runs"]}
    assert set(runs) == set(suites)
    assert len({run["automationDetails"]["id"] for run in log["runs"]}) == 4
    assert [x["ruleId"] for x in runs["hung"]["results"]] == [f"liveness.{hung_state}"]
    assert [x["ruleId"] for x in runs[dead_name]["results"]] == ["liveness.unreachable"]
    assert runs["a"]["results"] == [] or all(x["level"] != "error" for x in runs["a"]["results"])
    # progress per target on stderr; stdout carries the document only
    assert f"[hung] -> fail ({hung_state}" in r.stderr and "[a] -> pass (ran" in r.stderr


def test_library_call_bounded_concurrency_and_deadline_frees_the_slot():
    """A target slower than its deadline (each answer 3 s late: within the 5 s HTTP
    timeout, but first contact alone takes 6 s) is concluded at 5 s, a failed liveness
    case; with --concurrency 1 the next target starts only then."""
    seen: list[tuple[float, ev.Event]] = []
    with completions_server(Behaviour()) as (a, _), slow_server(3.0) as slow:
        targets = [FleetTarget("slow", slow), FleetTarget("a", a)]
        options = fleet.Options(certify.Options(checks=("liveness",), timeout=5.0), 1)
        t0 = time.monotonic()
        report = fleet.run(targets, options, lambda e: seen.append((time.monotonic(), e)))
    assert report.verdict == "fail" and report.exit_code == 1
    starts = {e.name: t for t, e in seen if isinstance(e, fleet.TargetStarted)}
    dones = {e.name: (t, e.state) for t, e in seen if isinstance(e, fleet.TargetDone)}
    assert dones["slow"][1] == "deadline" and dones["a"][1] == "ran", dones
    # one at a time: "a" waits for the slow one's slot, freed at its 5 s deadline
    assert starts["a"] >= dones["slow"][0] and starts["a"] - t0 >= 5.0
    assert [e.name for _, e in seen if isinstance(e, fleet.TargetDone)] == ["slow", "a"]
    inner = [e for _, e in seen if isinstance(e, fleet.TargetProgress)]
    assert any(isinstance(e.event, certify.CheckDone) for e in inner if e.name == "a")
    assert isinstance(seen[-1][1], ev.Finished)
    docs = {d["name"]: d for d in report.docs()}
    assert docs["a"]["verdict"] == "pass" and "schema" not in docs["a"]
    live = next(c for c in docs["slow"]["checks"] if c["check"] == "liveness")
    assert live["verdict"] == "fail" and live["findings"][0]["code"] == "liveness.deadline"
    assert docs["slow"]["state"] == "deadline" and 5.0 <= docs["slow"]["duration_s"] < 6.0


def test_resolve_keys_from_env_and_api_key_for_the_rest():
    from opsctl.console.judge import Target

    listed = [
        Target(name="a", url="http://127.0.0.1:1", source="targets", api_key_env="K1"),
        Target(name="b", url="http://127.0.0.1:2", source="argument"),
    ]
    out = fleet.resolve(listed, "cli-key", {"K1": "from-env"})
    assert [(t.name, t.api_key) for t in out] == [("a", "from-env"), ("b", "cli-key")]


def doc_fleet() -> tuple[str, str]:
    """docs/fleets.md's "Certify a fleet in CI" targets file and its `run:` command line."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "fleets.md").read_text()
    section = text.split("\n## Certify a fleet in CI\n", 1)[1].split("\n## ", 1)[0]
    toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    (line,) = [x for x in section.splitlines() if x.strip().startswith("- run: opsctl certify")]
    return toml, line.strip().removeprefix("- run: ")


def test_the_fleet_docs_ci_job_runs_as_written(tmp_path):
    """docs/fleets.md's targets file and command, with the two stand-ins in the places of its
    ports 8000 and 8001 (decode-2 wants the key its api_key_env names)."""
    import os

    toml, command = doc_fleet()
    assert command.startswith("opsctl certify --targets fleet.toml --junit fleet.xml")
    with completions_server(Behaviour()) as (one, _), keyed_server() as two:
        toml = toml.replace("http://127.0.0.1:8000", one).replace("http://127.0.0.1:8001", two)
        (tmp_path / "fleet.toml").write_text(toml)
        env = {**os.environ, "DECODE2_VLLM_KEY": KEY}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        r = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "fleet.json").read_text())
    assert doc["schema"] == "opsctl.certify.fleet/1" and doc["verdict"] == "pass"
    assert [t["name"] for t in doc["targets"]] == ["decode-1", "decode-2"]
    assert doc["targets"][0]["labels"] == {"role": "decode"}
    root = ET.parse(tmp_path / "fleet.xml").getroot()
    assert len(root.findall("testsuite")) == 2
    assert len(json.loads((tmp_path / "fleet.sarif").read_text())["runs"]) == 2
    (tmp_path / "fleet.toml").write_text(toml)
    env.pop("DECODE2_VLLM_KEY")  # the key's variable unset: bad input, nothing written
    for f in ("fleet.json", "fleet.xml", "fleet.sarif"):
        (tmp_path / f).unlink()
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "DECODE2_VLLM_KEY is not set" in r.stderr
    assert not (tmp_path / "fleet.xml").exists() and not (tmp_path / "fleet.sarif").exists()


def test_interrupted_fleet_keeps_what_finished_exit_130():
    """An interrupt (Ctrl-C, a stop signal, the live panel's quit) while the fleet runs:
    the targets that finished keep their report, the others say "interrupted"."""

    def progress(event: ev.Event) -> None:
        if isinstance(event, fleet.TargetStarted) and event.name == "b":
            raise KeyboardInterrupt

    with completions_server(Behaviour()) as (a, _), completions_server(Behaviour()) as (b, _):
        targets = [FleetTarget("a", a), FleetTarget("b", b)]
        options = fleet.Options(certify.Options(checks=("liveness",), timeout=20.0), 1)
        report = fleet.run(targets, options, progress)
    assert report.stop is not None and report.exit_code == 130
    docs = {d["name"]: d for d in report.docs()}
    assert (docs["a"]["verdict"], docs["a"]["state"]) == ("pass", "ran")
    assert docs["b"]["state"] == "interrupted" and docs["b"]["exit_code"] == 130
    assert {c["verdict"] for c in docs["b"]["checks"]} == {"skipped"}
