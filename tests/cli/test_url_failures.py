"""Every command that takes a URL, through the real CLI process, against each kind of
failure (docs/cli.md, exit codes): a closed port, an HTTP server that is not vLLM, a
server that accepts connections and never answers (hung) -> exit 3 "no vLLM server
answered"; an invalid URL -> exit 2. Each run says it in one ``opsctl: error:`` line
(plus at most one ``hint:``), never with a traceback; with ``--json`` a schema-versioned
document is on stdout (the state found and the error), except for bad input.

PENDING lists (command, kind) pairs of other work in progress that do not pass yet;
the assertions are the same for every command."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from tests.standins.vllm_server import StandInFleet

SCHEMA = re.compile(r"^opsctl\.[a-z0-9_.-]+/[0-9]+$")

# command -> argv before the URL (a short --timeout where the command has one, so a hung
# server costs seconds)
COMMANDS = {
    "status": ["status", "--timeout", "2s"],
    "diag usage": ["diag", "usage", "--timeout", "2s"],
    "diag invariance": ["diag", "invariance", "--timeout", "2s"],
    "diag mm-uuid": ["diag", "mm-uuid", "--timeout", "2s"],
    "diag lora": ["diag", "lora", "--timeout", "2s"],
    "certify": ["certify", "--timeout", "3s"],
    "console --once": ["console", "--once", "--no-discover", "--interval", "0.5s"],
}

# kind -> (exit code, words in the error line; None: any)
KINDS = {
    "closed-port": (3, "no server answered"),
    "not-vllm": (3, "not a vLLM server"),
    "hung": (3, "no server answered"),
    "bad-ipv4": (2, "not a valid URL"),
    "no-scheme-no-port": (2, "not an http(s) URL"),
    "bad-port": (2, "not a valid URL"),
}

# (command, kind) -> why it does not pass yet (other engineers' work in progress)
PENDING: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def urls():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    with StandInFleet(["notvllm", "hung"]) as fleet:
        yield {
            "closed-port": f"http://127.0.0.1:{closed.getsockname()[1]}",
            "not-vllm": fleet.urls[0],
            "hung": fleet.urls[1],
            "bad-ipv4": "http://256.1.1.1:9",
            "no-scheme-no-port": "notaurl",
            "bad-port": "http://127.0.0.1:99999",
        }
    closed.close()


CASES = [(c, k) for c in COMMANDS for k in KINDS]


@pytest.mark.parametrize(("command", "kind"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_url_failure(urls, tmp_path, request, command, kind):
    if (command, kind) in PENDING:  # strict: once it passes, PENDING must lose it
        request.applymarker(pytest.mark.xfail(strict=True, reason=PENDING[(command, kind)]))
    code, words = KINDS[kind]
    env = {**os.environ, "OPSCTL_HOME": str(tmp_path), "VLLM_API_KEY": "", "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "opsctl", *COMMANDS[command], urls[kind], "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("opsctl: error: ")]
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Task exception" not in r.stderr, r.stderr
    assert len(errors) == 1 and words in errors[0], r.stderr
    after = r.stderr.splitlines()[r.stderr.splitlines().index(errors[0]) + 1 :]
    assert after == [] or (len(after) == 1 and after[0].startswith("hint: ")), r.stderr
    if code == 2:  # bad input: nothing was looked at, no document
        assert r.stdout == "", r.stdout
        return
    doc = json.loads(r.stdout)  # one document, whatever happened
    assert SCHEMA.match(doc["schema"]), doc["schema"]
    state = _state(doc)
    assert state in ("unreachable", "unauthorized"), doc
    assert words in json.dumps(doc), doc  # the error is in the document too


def _state(doc: dict) -> str | None:
    """The state a document reports: top level (status, error, certify) or, for the
    console, its one endpoint."""
    if doc.get("state"):
        return doc["state"]
    endpoints = doc.get("endpoints") or []
    return endpoints[0].get("state") if len(endpoints) == 1 else None


def test_the_table_covers_every_command_that_takes_a_url():
    import typer

    from opsctl.cli import build_app

    root = typer.main.get_command(build_app())

    def walk(cmd, path=()):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), cmd

    takes_url = {
        name
        for name, cmd in walk(root)
        if any(p.param_type_name == "argument" and p.name in ("url", "urls") for p in cmd.params)
    }
    assert takes_url == {c.split(" --")[0] for c in COMMANDS}, takes_url
