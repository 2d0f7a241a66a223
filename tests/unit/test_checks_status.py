"""opsctl.checks.status called directly (no CLI) against stand-in servers: the console's
collector and domain give the state, the server version is a field of the document
(status --json once printed "schema": "opsctl.status/0.32.0" and no version), and the
errors are typed (unreachable and authentication required: exit 3)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks import status
from opsctl.checks.target import UrlTarget
from opsctl.cli import app
from opsctl.errors import BadInput, EngineUnreachable
from tests.standin import GuardedHandler, serving
from tests.standin_vllm import INFO, StandInFleet


@pytest.fixture(scope="module")
def fleet():
    with StandInFleet(["healthy", "busy", "dead", "notvllm", "keyed"]) as f:
        yield f


def test_healthy_server_report_carries_the_server_version(fleet):
    events: list = []
    report = status.run(UrlTarget(fleet.urls[0]), status.Options(timeout=5), events.append)
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.status/2"
    assert doc["version"] == INFO["version"]["version"] == "0.32.0"
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
    other = status.run(UrlTarget(fleet.urls[3]))
    doc = other.to_dict()
    assert other.verdict == "fail" and doc["state"] == "unreachable"
    assert doc["metrics"] is None and doc["metrics_error"] == "/metrics answered HTTP 404"


def test_keyed_server_needs_the_key(fleet):
    from tests.standin_vllm import KEY

    with pytest.raises(EngineUnreachable, match=r"authentication required.*401"):
        status.run(UrlTarget(fleet.urls[4]))
    report = status.run(UrlTarget(fleet.urls[4], api_key=KEY))
    assert report.verdict == "pass" and report.to_dict()["models"] == ["tiny-llama"]


def test_unreachable_and_bad_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(EngineUnreachable, match="no server answered"):
            status.run(UrlTarget(url), status.Options(timeout=2))
    with pytest.raises(BadInput, match="http"):
        status.run(UrlTarget("ftp://x"))


def test_cli_json_has_the_version_field_and_an_integer_schema(fleet):
    r = CliRunner().invoke(app, ["status", fleet.urls[0], "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.status/2" and doc["version"] == "0.32.0"
    r = CliRunner().invoke(app, ["status", fleet.urls[2], "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["healthy"] is False


def test_guarded_stand_in_gets_the_key_on_every_request():
    class H(GuardedHandler):
        seen: list = []

    with serving(H) as url:
        report = status.run(UrlTarget(url, api_key=GuardedHandler.API_KEY))
    doc = report.to_dict()
    assert doc["version"] == "0.0-standin" and doc["models"] == [GuardedHandler.MODEL]
    assert {auth for _, auth in H.seen} == {f"Bearer {GuardedHandler.API_KEY}"}
