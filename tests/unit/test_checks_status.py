"""opsctl.checks.status called directly (no CLI) against stand-in servers: the console's
collector and domain give the state, the server version is a field of the document
(status --json once printed "schema": "opsctl.status/0.32.0" and no version), and the
state is reported whatever it is, like systemctl status (unreachable, not a vLLM server
and authentication required: a document, exit 3; a bad URL: BadInput, exit 2)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks import status
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from opsctl.errors import BadInput
from tests.standins.base import GuardedHandler, StandInVllm, serving
from tests.standins.vllm_server import INFO, StandInFleet


@pytest.fixture(scope="module")
def fleet():
    with StandInFleet(["healthy", "busy", "dead", "notvllm", "keyed"]) as f:
        yield f


def test_healthy_server_report_carries_the_server_version(fleet):
    events: list = []
    report = status.run(UrlTarget(fleet.urls[0]), status.Options(timeout=5), events.append)
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.status/3"
    assert doc["vllm_version"] == INFO["version"]["version"] == "0.32.0"
    assert "version" not in doc  # one name per fact (status/2 had both)
    assert doc["platform"] is None and doc["error"] is None  # unknown is null, not prose
    assert status.exit_code(report) == 0
    assert doc["models"] == ["tiny-llama"] and doc["state"] == "ready" and doc["reason"] is None
    m = doc["metrics"]
    assert m["requests_running"] == 0 and m["series"] > 20 and m["kv_capacity_tokens"] > 0
    assert m["ttft_mean_s"] is not None and m["ttft_p50_s"] is not None
    assert doc["metrics_error"] is None
    assert isinstance(events[0], ev.Phase) and isinstance(events[-1], ev.Finished)


def test_busy_dead_and_not_vllm(fleet):
    busy = status.run(UrlTarget(fleet.urls[1]))
    assert busy.verdict == "pass" and busy.to_dict()["state"] == "busy"
    assert busy.to_dict()["metrics"]["requests_running"] == 4
    dead = status.run(UrlTarget(fleet.urls[2])).to_dict()
    assert dead["healthy"] is False and dead["health_status"] == 503
    assert dead["state"] == "dead" and "/health HTTP 503" in dead["reason"]
    assert status.exit_code(status.run(UrlTarget(fleet.urls[2]))) == 1
    other = status.run(UrlTarget(fleet.urls[3]))
    doc = other.to_dict()
    assert other.verdict == "fail" and doc["state"] == "unreachable"
    assert doc["error"].startswith(f"not a vLLM server at {fleet.urls[3]} (answers HTTP")
    assert doc["metrics"] is None and doc["metrics_error"] == "/metrics answered HTTP 404"
    assert status.exit_code(other) == 3


def test_keyed_server_needs_the_key(fleet):
    from tests.standins.vllm_server import KEY

    refused = status.run(UrlTarget(fleet.urls[4]))
    assert refused.to_dict()["state"] == "unauthorized" and status.exit_code(refused) == 3
    assert (
        refused.to_dict()["error"] == f"authentication required: {fleet.urls[4]} answered HTTP 401"
    )
    report = status.run(UrlTarget(fleet.urls[4], api_key=KEY))
    assert report.verdict == "pass" and report.to_dict()["models"] == ["tiny-llama"]


def test_unreachable_and_bad_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        report = status.run(UrlTarget(url), status.Options(timeout=2))
    doc = report.to_dict()
    assert (doc["state"], doc["healthy"], doc["health_status"]) == ("unreachable", False, None)
    assert doc["error"].startswith(f"no server answered at {url}")
    assert status.exit_code(report) == 3
    with pytest.raises(BadInput, match="http"):
        status.run(UrlTarget("ftp://x"))
    with pytest.raises(BadInput, match="IPv4"):
        status.run(UrlTarget("http://256.1.1.1:9"))


def test_cli_json_has_the_version_field_and_an_integer_schema(fleet):
    r = CliRunner().invoke(app, ["status", fleet.urls[0], "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.status/3" and doc["vllm_version"] == "0.32.0"
    r = CliRunner().invoke(app, ["status", fleet.urls[2], "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["healthy"] is False


def test_guarded_stand_in_gets_the_key_on_every_request():
    class H(GuardedHandler):
        seen: list = []

    with serving(H) as url:
        report = status.run(UrlTarget(url, api_key=GuardedHandler.API_KEY))
    doc = report.to_dict()
    assert doc["vllm_version"] == "0.0-standin" and doc["models"] == [GuardedHandler.MODEL]
    assert {auth for _, auth in H.seen} == {f"Bearer {GuardedHandler.API_KEY}"}


def test_url_without_a_scheme_is_read_as_http(fleet):
    host_port = fleet.urls[0].removeprefix("http://")
    r = CliRunner().invoke(app, ["status", host_port, "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["url"] == fleet.urls[0]


@pytest.mark.parametrize("value", ["0", "-1", "0s", "soon"])
def test_timeout_is_a_validated_duration(value):
    r = CliRunner().invoke(app, ["status", "http://127.0.0.1:9", "--timeout", value])
    assert r.exit_code == 2 and "--timeout" in r.stderr and r.stdout == ""


def test_a_server_that_answers_health_then_goes_quiet_is_a_timeout_exit_4():
    import threading

    release = threading.Event()

    class Slow(StandInVllm):
        def metrics_text(self) -> str | None:
            release.wait(30)  # no answer until the test is done
            return super().metrics_text()

    try:
        with serving(Slow) as url:
            report = status.run(UrlTarget(url), status.Options(timeout=1))
            release.set()
    finally:
        release.set()
    doc = report.to_dict()
    assert doc["timed_out"] is True and doc["health_status"] == 200
    assert doc["error"] == f"{url}: /metrics gave no answer within 1 s (/health answered HTTP 200)"
    assert status.exit_code(report) == 4
    # and a refused port is not a timeout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = status.run(UrlTarget(f"http://127.0.0.1:{s.getsockname()[1]}"))
    assert refused.to_dict()["timed_out"] is False and status.exit_code(refused) == 3
