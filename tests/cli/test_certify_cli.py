"""`opsctl certify` without a real engine: flag errors (exit 2, no report), no vLLM server
at the URL (exit 3: a closed port, an HTTP server that is not vLLM, a server that
accepts and never answers; the real CLI process, and the JUnit and SARIF files written
all the same, validated against the shipped schemas), a check that crashes (its error
case, exit 1, the others reported), and whole certifications of stand-in servers
(tests/standins/completions.py): a generative stand-in with an opsctl run directory
passes liveness, the patch ledger, Engram hygiene and invariance and skips the rest with
reasons; a stand-in that diverges under batching fails invariance alone, identically in
JSON, JUnit and SARIF. The library entry point (opsctl.checks.certify.run) is called
directly for its typed events."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from typer.testing import CliRunner

from opsctl.checks import certify
from opsctl.checks import events as ev
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from tests.engram_tables import no_test_tables
from tests.expect import expected, verdicts
from tests.standins.base import serving
from tests.standins.completions import Behaviour, completions_server, register_run, write_run_dir
from tests.standins.vllm_server import StandInFleet

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"
runner = CliRunner()


@contextlib.contextmanager
def standin(home: Path, **behaviour) -> Iterator[str]:
    """A generative stand-in whose run directory find_run_dir() finds from its URL."""
    run_dir = home / "runs" / "standin"
    write_run_dir(run_dir)
    with completions_server(Behaviour(run_dir=run_dir, **behaviour)) as (url, _):
        register_run(run_dir, url)
        yield url


def invoke(*args: str, tmp: Path):
    junit, sarif = tmp / "report.xml", tmp / "report.sarif"
    # certify's engram check judges every table on the host: no other test's (some are
    # planted not constant-filled) may be there meanwhile. Two fresh clones under a CPU
    # hog failed so, each in a test that had not taken the lock.
    with no_test_tables():
        r = runner.invoke(
            app, ["certify", *args, "--json", "--junit", str(junit), "--sarif", str(sarif)]
        )
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r, doc, junit, sarif


def validated(junit: Path, sarif: Path) -> tuple[ET.Element, dict]:
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(str(junit))
    log = json.loads(sarif.read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    assert all(r["locations"] for r in log["runs"][0]["results"])
    return ET.parse(junit).getroot(), log


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((), "give a server URL or --model"),
        (("http://127.0.0.1:9", "--model", "tiny-llama"), "not both"),
        (("--model", "tiny-llama", "--checks", "liveness,bogus"), "unknown check(s) bogus"),
        (("--model", "tiny-llama", "--timeout", "0"), "--timeout"),
        (("--model", "tiny-llama", "--timeout", "-1"), "--timeout"),
        (("--model", "tiny-llama", "--timeout", "soon"), "--timeout"),
        (("--model", "tiny-llama", "--checks", "usage"), "cannot run usage: decoder model"),
        (("--model", "tiny-llama", "--checks", "kv-fail", "--skip", "kv-fail"), "both"),
        (("--model", "no-such-model"), "unknown embedded model"),
        (("http://256.1.1.1:9",), "bad IPv4 address 256.1.1.1"),
        (("notaurl",), "not an http(s) URL: 'notaurl'"),
    ],
)
def test_usage_errors_exit_2_and_write_no_report(args, text, tmp_path):
    junit, sarif = tmp_path / "j.xml", tmp_path / "s.sarif"
    r = runner.invoke(app, ["certify", *args, "--junit", str(junit), "--sarif", str(sarif)])
    assert r.exit_code == 2, r.stderr
    assert text in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[0].startswith("opsctl: error:")
    assert len(r.stderr.splitlines()) <= 2  # the error line, at most one hint
    assert r.stdout == ""
    assert not junit.exists() and not sarif.exists()  # documented: bad input, no report


def test_timeout_takes_durations():
    from opsctl.commands.options import parse_duration_flag

    for given, seconds in (("30", 30.0), ("30s", 30.0), ("5m", 300.0)):
        assert parse_duration_flag(given) == seconds
    assert "DURATION" in runner.invoke(app, ["certify", "--help"]).stdout


# ---- no vLLM server answered: the real CLI process, and the report written anyway -----


@contextlib.contextmanager
def closed_port() -> Iterator[str]:
    """A port bound on 127.0.0.1 and never listened on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def not_vllm() -> Iterator[str]:
    """An HTTP server that is not vLLM: a web page at /, 404 elsewhere."""
    with StandInFleet(["notvllm"]) as fleet:
        yield fleet.urls[0]


@contextlib.contextmanager
def hung() -> Iterator[str]:
    """Listens (the kernel completes every connect), never accepts nor answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def certify_process(
    target: str, tmp: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The real CLI process: ``opsctl certify TARGET --json --junit --sarif ...``."""
    junit, sarif = tmp / "ci" / "report.xml", tmp / "ci" / "report.sarif"  # ci/: made
    args = [*target.split(" "), "--json", "--junit", str(junit), "--sarif", str(sarif)]
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "certify", *args, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    return r, junit, sarif


@pytest.mark.parametrize(
    ("server", "error"),
    [
        (closed_port, "no server answered at {url}: ConnectError"),
        (not_vllm, "not a vLLM server at {url}: /health answered HTTP 404, /v1/models HTTP 404"),
        (hung, "no server answered at {url}: connected, but no HTTP answer within 2 s"),
    ],
    ids=["closed-port", "not-vllm", "hung"],
)
def test_no_vllm_server_is_one_failed_liveness_case_exit_3(server, error, tmp_path):
    with server() as url:
        t0 = time.monotonic()
        r, junit, sarif = certify_process(url, tmp_path, "--timeout", "2s")
        took = time.monotonic() - t0
    message = error.format(url=url)
    assert r.returncode == 3, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert errors == [f"opsctl: error: {message}"]
    assert "Traceback" not in r.stderr
    assert took < 60  # the hung server is given up on after --timeout, not 5 minutes
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.certify/2" and doc["exit_code"] == 3
    assert (doc["state"], doc["error"], doc["verdict"]) == ("unreachable", message, "fail")
    assert doc["fingerprint"]["vllm_version"] is None and doc["fingerprint"]["platform"] is None
    got = verdicts(doc)
    assert got.pop("liveness") == "fail" and set(got.values()) == {"skipped"}
    # both files, valid against the shipped schemas
    root, log = validated(junit, sarif)
    (suite,) = root.findall("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("1", "0")
    failure = suite.find("testcase[@name='liveness']/failure")
    assert failure.get("type") == "liveness.unreachable" and failure.get("message") == message
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "liveness.unreachable" and result["level"] == "error"
    where = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert where == {"uri": "ci/report.sarif", "uriBaseId": "%SRCROOT%"}  # the report file
    assert log["runs"][0]["invocations"][0]["exitCode"] == 3


def test_no_vllm_server_human_summary_and_scheme_less_url(tmp_path):
    with closed_port() as url:
        bare = url.removeprefix("http://")
        r = subprocess.run(
            [sys.executable, "-m", "opsctl", "certify", bare, "--junit", "j.xml"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert r.returncode == 3, r.stderr
    assert "liveness" in r.stdout and "FAIL" in r.stdout and "verdict: FAIL" in r.stdout
    assert r.stderr.splitlines()[-1].startswith(f"opsctl: error: no server answered at {url}")
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.find("testsuite/testcase[@name='liveness']/failure") is not None


def test_checks_naming_a_check_a_url_cannot_run_is_exit_2(home):
    with standin(home) as url:
        r = runner.invoke(app, ["certify", url, "--checks", "liveness,kv-fail"])
    assert r.exit_code == 2
    assert "kv-fail: a URL cannot host kv-fail injection" in r.stderr


def test_standin_passes_applicable_checks_and_skips_the_rest(home, tmp_path):
    with standin(home) as url:
        r, doc, junit, sarif = invoke(url, tmp=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert doc["schema"] == "opsctl.certify/2" and doc["verdict"] == "pass"
    assert (doc["state"], doc["error"]) == ("ran", None)
    assert verdicts(doc) == expected(pass_="liveness patches engram invariance")
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert "pooling model" in reasons["usage"] and "URL cannot host" in reasons["kv-fail"]
    assert doc["summary"]["engine_starts"] == 0 and doc["engines"] == []
    live = next(c for c in doc["checks"] if c["check"] == "liveness")
    assert live["report"]["counter"]["after"] > live["report"]["counter"]["before"]
    assert doc["fingerprint"]["vllm_version"] == "0.0-standin"
    root, log = validated(junit, sarif)
    assert root.find("testsuite").get("failures") == "0"
    assert log["runs"][0]["invocations"][0]["exitCode"] == 0
    assert not [x for x in log["runs"][0]["results"] if x["level"] == "error"]
    # the human summary: one row per check
    with completions_server(Behaviour()) as (plain_url, _):
        r = runner.invoke(app, ["certify", plain_url, "--checks", "liveness"])
    assert r.exit_code == 0, r.stderr
    assert "liveness" in r.stdout and "PASS" in r.stdout and "verdict: PASS" in r.stdout


def test_diverging_standin_fails_invariance_alone_in_every_format(home, tmp_path):
    with standin(home, diverge=("fox", 3, 0.01)) as url:
        r, doc, junit, sarif = invoke(url, tmp=tmp_path)
    assert r.exit_code == 1
    # a failure names what else failed (a fresh clone once saw engram fail here too)
    others = [c for c in (doc or {}).get("checks", []) if c["check"] != "invariance"]
    assert "certify failed: invariance" in r.stderr, [
        (c["check"], c["verdict"], c.get("first_finding")) for c in others
    ]
    failed = {c["check"] for c in doc["checks"] if c["verdict"] in ("fail", "error")}
    assert failed == {"invariance"}
    root, log = validated(junit, sarif)
    in_junit = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    errors = {x["properties"]["check"] for x in log["runs"][0]["results"] if x["level"] == "error"}
    assert in_junit == errors == failed
    rule = next(x for x in log["runs"][0]["results"] if x["level"] == "error")["ruleId"]
    assert rule == "invariance.divergence"


def test_library_call_typed_events_one_case_per_check(home):
    seen: list[ev.Event] = []
    with standin(home) as url:
        report = certify.run(UrlTarget(url), certify.Options(skip=("engram",)), seen.append)
    assert report.verdict == "pass" and report.exit_code == 0
    started = [e.check for e in seen if isinstance(e, certify.CheckStarted)]
    done = [(e.name, e.verdict) for e in seen if isinstance(e, certify.CheckDone)]
    assert started == ["liveness", "patches", "invariance"]
    assert done == [("liveness", "pass"), ("patches", "pass"), ("invariance", "pass")]
    inner = [e for e in seen if isinstance(e, certify.CheckProgress)]
    assert {e.check for e in inner} == {"liveness", "patches", "invariance"}
    assert any(isinstance(e.event, ev.Finished) for e in inner)
    assert isinstance(seen[0], ev.Started) and isinstance(seen[-1], ev.Finished)
    assert report.verdicts()["engram"] == "skipped"


def test_a_check_timing_out_is_exit_4_and_reported_as_error(tmp_path):
    from tests.standins.scoring import stand_in

    with stand_in(sleep=3.0) as url:
        r, doc, junit, sarif = invoke(url, "--checks", "usage", "--timeout", "1", tmp=tmp_path)
    assert r.exit_code == 4, r.stderr
    usage = next(c for c in doc["checks"] if c["check"] == "usage")
    assert usage["verdict"] == "error" and usage["timed_out"]
    assert doc["exit_code"] == 4
    root, log = validated(junit, sarif)
    assert root.find("testsuite/testcase[@name='usage']/error") is not None
    assert [x["ruleId"] for x in log["runs"][0]["results"]] == ["usage.timeout"]


def test_a_check_that_crashes_is_an_error_case_and_the_others_are_reported(
    home, tmp_path, monkeypatch
):
    from opsctl.suite.engram import run as hygiene

    def broken(*args, **kwargs):
        raise RuntimeError("engram check blew up")

    monkeypatch.setattr(hygiene, "engram", broken)
    with standin(home) as url:
        r, doc, junit, sarif = invoke(url, tmp=tmp_path)
    assert r.exit_code == 1, r.stderr
    assert "certify failed: engram" in r.stderr
    got = verdicts(doc)
    assert got["engram"] == "error"
    assert got["liveness"] == got["patches"] == got["invariance"] == "pass"
    engram = next(c for c in doc["checks"] if c["check"] == "engram")
    assert engram["reason"] == "internal error: RuntimeError: engram check blew up"
    assert (doc["state"], doc["exit_code"]) == ("ran", 1)
    root, log = validated(junit, sarif)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == set(got)  # every check still reported
    error = cases["engram"].find("error")
    assert error is not None and error.get("type") == "engram.error"
    assert "RuntimeError: engram check blew up" in error.get("message")
    assert all(cases[c].find("failure") is None for c in ("liveness", "patches", "invariance"))
    (result,) = [x for x in log["runs"][0]["results"] if x["level"] == "error"]
    assert result["ruleId"] == "engram.error" and result["locations"]


def test_certify_itself_crashing_still_writes_the_report(tmp_path, monkeypatch):
    from opsctl.checks import certify_plan

    def broken(*args, **kwargs):
        raise RuntimeError("planning blew up")

    monkeypatch.setattr(certify_plan, "url_facts", broken)
    r, doc, junit, sarif = invoke("http://127.0.0.1:9", tmp=tmp_path)
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-1] == (
        "opsctl: error: internal error: RuntimeError: planning blew up"
    )
    assert (doc["state"], doc["exit_code"]) == ("crashed", 1)
    root, _ = validated(junit, sarif)
    assert root.find("testsuite/testcase[@name='liveness']/error") is not None


def test_interrupted_certification_writes_what_ran_and_exits_130(tmp_path):
    """SIGINT (CI cancelling a job, Ctrl-C) while liveness waits on a slow server: exit
    130, the files hold liveness as an interrupted error case and usage not run."""
    from tests.standins.scoring import stand_in
    from tests.waiting import wait_until

    junit, sarif = tmp_path / "j.xml", tmp_path / "s.sarif"
    err = tmp_path / "stderr.txt"
    with stand_in(sleep=60.0) as url, open(err, "w") as stderr:
        args = [url, "--checks", "liveness,usage", "--json", "--junit", str(junit)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "opsctl", "certify", *args, "--sarif", str(sarif)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=tmp_path,
        )
        try:
            wait_until(
                lambda: "liveness: POST /score" in err.read_text(), 60, "the /score request",
                err.read_text,
            )  # fmt: skip
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err.read_text()
    assert err.read_text().splitlines()[-1].startswith("opsctl: interrupted")
    doc = json.loads(out)
    assert (doc["state"], doc["exit_code"]) == ("interrupted", 130)
    assert doc["error"] == "interrupted by SIGINT"
    assert verdicts(doc)["liveness"] == "error"
    usage = next(c for c in doc["checks"] if c["check"] == "usage")
    assert (usage["verdict"], usage["reason"]) == ("skipped", "not run: interrupted")
    root, log = validated(junit, sarif)
    error = root.find("testsuite/testcase[@name='liveness']/error")
    assert error is not None and error.get("message") == "interrupted"
    assert log["runs"][0]["invocations"][0]["exitCode"] == 130


@pytest.mark.engine
def test_an_engine_that_never_starts_is_an_error_case_in_the_report(tmp_path):
    """certify --model on a directory vLLM refuses: one real (failed) engine start; the
    report names the failed start and the check it was for."""
    model = tmp_path / "no-such-arch"
    model.mkdir()
    config = {"architectures": ["NoSuchArchForCausalLM"], "model_type": "llama"}
    (model / "config.json").write_text(json.dumps(config))
    r, junit, sarif = certify_process(f"--model {model}", tmp_path, "--checks", "liveness")
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["state"] == "start_failed" and "before becoming healthy" in doc["error"]
    assert doc["target"] == {"kind": "managed", "url": None}
    (failed,) = doc["failed_starts"]
    assert failed["check"] == "liveness" and failed["error"] == doc["error"]
    assert doc["summary"]["engine_starts"] == 0 and doc["engines"] == []
    live = next(c for c in doc["checks"] if c["check"] == "liveness")
    assert live["verdict"] == "error" and live["reason"] == doc["error"]
    root, log = validated(junit, sarif)
    error = root.find("testsuite/testcase[@name='liveness']/error")
    assert error is not None and error.get("message") == doc["error"]
    assert [x["ruleId"] for x in log["runs"][0]["results"]] == ["liveness.error"]
    errors = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert errors == [errors[0]] and errors[0].startswith("opsctl: error: certify failed: liveness")


def test_a_refused_api_key_is_state_unauthorized_exit_3(tmp_path, monkeypatch):
    from tests.standins.base import GuardedHandler

    class Guarded(GuardedHandler):
        seen: list = []

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with serving(Guarded) as url:
        r, doc, junit, sarif = invoke(url, "--api-key", "wrong", tmp=tmp_path)
    assert r.exit_code == 3, r.stderr
    assert (doc["state"], doc["exit_code"]) == ("unauthorized", 3)
    assert doc["error"] == f"authentication required: {url}/v1/models answered HTTP 401"
    assert r.stderr.splitlines()[-2:] == [
        f"opsctl: error: {doc['error']}",
        "hint: the server refused the API key given (--api-key / VLLM_API_KEY)",
    ]
    root, log = validated(junit, sarif)
    failure = root.find("testsuite/testcase[@name='liveness']/failure")
    assert failure.get("type") == "liveness.unauthorized"
    assert [x["ruleId"] for x in log["runs"][0]["results"]] == ["liveness.unauthorized"]
