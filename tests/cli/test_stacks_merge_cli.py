"""`opsctl stacks --merge`: what is not a set of reports of one server's hosts is bad input
(exit 2, one line, nothing taken). Two real reports merged into one verdict:
tests/e2e/test_rank_hang_e2e.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from opsctl.cli import app


def run(*args: str):
    return CliRunner().invoke(app, ["stacks", *args])


def report(host: str) -> dict:
    return {
        "schema": "opsctl.stacks/2",
        "host": host,
        "processes": [{"pid": 7, "role": "Worker_TP0", "source": "none", "threads": []}],
    }


@pytest.mark.parametrize(
    "args, says",
    [
        (("--merge", "a.json"), "--merge takes two reports or more"),
        (("127.0.0.1:8000", "127.0.0.1:8001"), "give one URL|RUN|PID"),
        (("--merge", "a.json", "missing.json"), "cannot read missing.json"),
        (("--merge", "a.json", "a.json"), "a.json and a.json both hold node-a's Worker_TP0"),
        (("--merge", "a.json", "old.json"), "old.json is not an opsctl.stacks/2 report"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps(report("node-a")))
    (tmp_path / "old.json").write_text(
        json.dumps({**report("node-b"), "schema": "opsctl.stacks/1"})
    )
    r = run(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert says in r.stderr and r.stdout == ""
