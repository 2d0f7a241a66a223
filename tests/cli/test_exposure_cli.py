"""Exposure and test knobs at the CLI (issue 9, points 4 and 5), without an engine:

- serve refuses extra vLLM args that set what opsctl owns (--host, --port, --api-key in
  any spelling vLLM would accept) and an unauthenticated non-loopback bind, before
  anything starts (exit 2, one line, a hint naming opsctl's flag);
- the hidden --test-knob is the only way a knob reaches the launch request, never the
  environment;
- status and the URL diags send the API key (default VLLM_API_KEY) and report a server
  that wants one as "authentication required" (exit 3), against a stand-in server that
  guards /v1 as vLLM's --api-key does.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.cli import app
from tests.standins.base import GuardedHandler, serving
from tests.standins.cli_result import error_lines

runner = CliRunner()


@pytest.fixture
def serve_calls(monkeypatch) -> list:
    """Replace the engine start: record the ServeRequest serve would run."""
    from opsctl.engine import supervise

    calls: list = []

    def fake(req, on_event, dashboard=None) -> int:
        calls.append(req)
        return 0

    monkeypatch.setattr(supervise, "serve", fake)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return calls


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--host", "0.0.0.0"], "--host"),
        (["--host=0.0.0.0"], "--host"),
        (["--port", "9000"], "--port"),
        (["--port=9000"], "--port"),
        (["--api-key", "k"], "--api-key"),
        (["--api_key=k"], "--api-key"),
        (["--ho", "0.0.0.0"], "--host"),  # argparse would take the unique prefix
        (["--max-model-len", "128", "--port", "1"], "--port"),
    ],
)
def test_owned_extra_args_are_refused_with_opsctls_flag(serve_calls, extra, flag):
    r = runner.invoke(app, ["serve", "--no-tui", "--", *extra])
    assert r.exit_code == 2, r.output
    (line,) = error_lines(r)
    assert "opsctl owns" in line
    hints = [x for x in r.stderr.splitlines() if x.startswith("hint:")]
    assert len(hints) == 1 and flag in hints[0]
    assert r.stdout == "" and serve_calls == []  # nothing started


def test_other_extra_args_pass_through(serve_calls):
    r = runner.invoke(app, ["serve", "--no-tui", "--", "--max-model-len", "128", "--hf-token=x"])
    assert r.exit_code == 0, r.output
    assert list(serve_calls[0].extra) == ["--max-model-len", "128", "--hf-token=x"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com", "192.168.0.1"])
def test_non_loopback_bind_needs_a_key_or_insecure_bind(serve_calls, host):
    r = runner.invoke(app, ["serve", "--no-tui", "--host", host])
    assert r.exit_code == 2, r.output
    (line,) = error_lines(r)
    assert "unauthenticated" in line and host in line
    assert "--insecure-bind" in r.stderr and serve_calls == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_bind_needs_nothing(serve_calls, host):
    r = runner.invoke(app, ["serve", "--no-tui", "--host", host])
    assert r.exit_code == 0, r.output
    assert serve_calls[0].host == host and serve_calls[0].api_key is None


def test_wide_bind_with_a_key_says_all_interfaces_and_passes_the_key(serve_calls):
    r = runner.invoke(app, ["serve", "--no-tui", "--host", "0.0.0.0", "--api-key", "K"])
    assert r.exit_code == 0, r.output
    assert serve_calls[0].api_key == "K" and serve_calls[0].host == "0.0.0.0"
    assert "listening on all interfaces" in r.stderr and "API key required" in r.stderr
    assert "http://0.0.0.0" not in r.stderr  # a URL another machine can use


def test_api_key_defaults_to_vllm_api_key_and_insecure_bind_is_loud(serve_calls, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    r = runner.invoke(app, ["serve", "--no-tui", "--host", "10.1.2.3"])
    assert r.exit_code == 0, r.output
    assert serve_calls[-1].api_key == "from-env"
    monkeypatch.delenv("VLLM_API_KEY")
    r = runner.invoke(app, ["serve", "--no-tui", "--host", "10.1.2.3", "--insecure-bind"])
    assert r.exit_code == 0, r.output
    assert serve_calls[-1].api_key is None and "NO authentication" in r.stderr


def test_knobs_come_only_from_the_hidden_flag(serve_calls, monkeypatch):
    monkeypatch.setenv(knobs.NUDGE, "zebra:1")
    monkeypatch.setenv(knobs.MM_UUID_REWRITE, "x")
    monkeypatch.setenv(knobs.ENABLE, "1")
    r = runner.invoke(app, ["serve", "--no-tui"])
    assert r.exit_code == 0, r.output
    assert serve_calls[-1].knobs == {}  # the environment never arms a knob
    r = runner.invoke(app, ["serve", "--no-tui", "--test-knob", f"{knobs.MM_UUID_REWRITE}=u1"])
    assert r.exit_code == 0, r.output
    assert serve_calls[-1].knobs == {knobs.MM_UUID_REWRITE: "u1"}
    assert "TEST KNOBS" in r.stderr


@pytest.mark.parametrize(
    ("cmd", "bad", "needle"),
    [
        (["serve", "--no-tui"], "NOPE=1", "unknown test knob 'NOPE'"),
        (["serve", "--no-tui"], knobs.NUDGE, "NAME=VALUE"),
        (["diag", "kv-fail"], "NOPE=1", "unknown test knob"),
        (["diag", "usage", "http://127.0.0.1:9"], f"{knobs.NUDGE}=a:1", "needs an engine"),
    ],
)
def test_bad_test_knob_is_bad_input(serve_calls, cmd, bad, needle):
    r = runner.invoke(app, [*cmd, "--test-knob", bad])
    assert r.exit_code == 2, r.output
    (line,) = error_lines(r)
    assert needle in line


@pytest.mark.parametrize(
    "cmd",
    [
        ["serve"],
        ["diag", "usage"],
        ["diag", "mm-uuid"],
        ["diag", "invariance"],
        ["diag", "kv-fail"],
    ],
)
def test_test_knob_is_hidden_from_help(cmd):
    r = runner.invoke(app, [*cmd, "--help"])
    assert r.exit_code == 0
    assert "--test-knob" not in r.stdout and "knob" not in r.stdout.lower()


@pytest.fixture
def guarded():
    class H(GuardedHandler):
        seen: list = []

    with serving(H) as url:
        yield url, H


def test_status_without_key_is_authentication_required(guarded, monkeypatch):
    url, _ = guarded
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    r = runner.invoke(app, ["status", url, "--json"])
    assert r.exit_code == 3, r.output
    (line,) = error_lines(r)
    assert "authentication required" in line and "401" in line
    # like systemctl status, the state found is the result: on stdout, with --json too
    assert "--api-key" in r.stderr and json.loads(r.stdout)["state"] == "unauthorized"


def test_status_with_a_wrong_key_is_authentication_required(guarded):
    url, _ = guarded
    r = runner.invoke(app, ["status", url, "--api-key", "wrong"])
    assert r.exit_code == 3, r.output
    (line,) = error_lines(r)
    assert "authentication required" in line and "refused the API key" in r.stderr


@pytest.mark.parametrize("via_env", [False, True])
def test_status_with_the_key_sends_it_on_every_request(guarded, monkeypatch, via_env):
    url, handler = guarded
    if via_env:
        monkeypatch.setenv("VLLM_API_KEY", GuardedHandler.API_KEY)
        args = ["status", url, "--json"]
    else:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
        args = ["status", url, "--json", "--api-key", GuardedHandler.API_KEY]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["healthy"] is True and doc["models"] == [GuardedHandler.MODEL]
    assert doc["metrics_error"] is None
    paths = {p for p, _ in handler.seen}
    assert {"/health", "/v1/models", "/metrics"} <= paths
    assert {auth for _, auth in handler.seen} == {f"Bearer {GuardedHandler.API_KEY}"}


@pytest.mark.parametrize(
    "cmd",
    [["diag", "usage"], ["diag", "mm-uuid"], ["diag", "invariance"]],
)
def test_url_diags_without_key_are_authentication_required(guarded, monkeypatch, cmd):
    url, _ = guarded
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    r = runner.invoke(app, [*cmd, url, "--json"])
    assert r.exit_code == 3, r.output
    (line,) = error_lines(r)
    assert "authentication required" in line
    doc = json.loads(r.stdout)  # --json prints a document whatever happened
    assert doc["schema"] == "opsctl.error/1" and doc["state"] == "unauthorized", doc


@pytest.mark.parametrize(
    "cmd",
    [["diag", "usage"], ["diag", "mm-uuid"], ["diag", "invariance"]],
)
def test_url_diags_send_the_key(guarded, monkeypatch, cmd):
    """With the key the diags get past authentication (the stand-in serves no model
    endpoints, so each stops later, for its own reason, never exit 3)."""
    url, handler = guarded
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    r = runner.invoke(app, [*cmd, url, "--json", "--api-key", GuardedHandler.API_KEY])
    assert r.exit_code not in (0, 3), r.output
    assert "authentication" not in r.stderr
    v1 = [auth for path, auth in handler.seen if path.startswith("/v1")]
    assert v1 and set(v1) == {f"Bearer {GuardedHandler.API_KEY}"}


def test_serve_collector_client_carries_the_engines_key():
    from types import SimpleNamespace

    from opsctl.serve.collect import ServeCollector

    server = SimpleNamespace(opts=SimpleNamespace(api_key="K"))
    c = ServeCollector(server)
    try:
        assert c.client.headers["Authorization"] == "Bearer K"
    finally:
        c.close()
    c = ServeCollector(SimpleNamespace(opts=SimpleNamespace(api_key=None)))
    try:
        assert "Authorization" not in c.client.headers
    finally:
        c.close()


class _Refused(Exception):
    pass


@pytest.fixture
def launches(monkeypatch) -> list:
    """Replace EngineServer: record the LaunchOptions a command builds, then stop with
    bad input before anything is spawned."""
    from opsctl.engine import server as srv
    from opsctl.errors import BadInput

    seen: list = []

    class Recorder:
        def __init__(self, opts) -> None:
            seen.append(opts)
            self.opts, self.run_dir, self.proc, self.stop_report = opts, None, None, None

        def start(self):
            raise BadInput("recorded; not starting")

        def stop(self, *a, **k):
            return srv.StopReport(0.0, [], [], [], [], None)

    monkeypatch.setattr(srv, "EngineServer", Recorder)
    monkeypatch.setenv(knobs.NUDGE, "from-env:1")  # must never get through
    monkeypatch.setenv(knobs.ENABLE, "1")
    return seen


@pytest.mark.parametrize(
    ("cmd", "knob"),
    [
        (["serve", "--no-tui", "--port", "8765"], knobs.NUDGE),
        (["diag", "usage", "--model", "tiny-reranker"], knobs.NUDGE),
        (["diag", "mm-uuid", "--model", "tiny-vlm-multi"], knobs.MM_UUID_REWRITE),
        (["diag", "invariance", "--model", "tiny-llama"], knobs.NUDGE),
        (["diag", "kv-fail", "--model", "tiny-llama"], knobs.NUDGE),
    ],
)
def test_test_knob_reaches_the_launch_options_and_env_knobs_do_not(launches, cmd, knob):
    r = runner.invoke(app, cmd)
    assert r.exit_code == 2 and "recorded; not starting" in r.stderr, r.output
    assert launches[-1].knobs == {}
    r = runner.invoke(app, [*cmd, "--test-knob", f"{knob}=armed:2"])
    assert r.exit_code == 2 and "recorded; not starting" in r.stderr, r.output
    assert launches[-1].knobs == {knob: "armed:2"}


def test_serve_api_key_reaches_the_launch_options(launches):
    r = runner.invoke(app, ["serve", "--no-tui", "--port", "8765", "--api-key", "K"])
    assert r.exit_code == 2, r.output
    assert launches[-1].api_key == "K" and launches[-1].port == 8765
