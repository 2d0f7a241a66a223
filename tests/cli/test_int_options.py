"""Every integer option and argument of every command refuses what is not a plain integer.

Typer 0.29 converts ``int`` parameters with pydantic's lax parsing: ``--seed 0-4`` was read as
-4 (``diag kv-fail`` ran seed -4 without a word), ``1_000`` as 1000, ``1.0`` as 1. The CLI root
installs one rule (opsctl.commands.options.plain_int) for all of them; this walks the whole
command tree so a new int option cannot slip past it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.core import TyperArgument, TyperOption

from opsctl.cli import app, int_annotation

NOT_INTEGERS = ("0-4", "1_000", "1.0", "4-2", " ", "0x10", "3e2")


def _int_params():
    """(command path, parameter) for every int option/argument in the tree."""
    out = []

    def walk(cmd, path):
        for p in getattr(cmd, "params", ()):
            desc = getattr(p, "type_descriptor", None)
            if (
                isinstance(p, TyperOption | TyperArgument)
                and desc
                and int_annotation(desc.annotation)
            ):
                out.append((" ".join(path), p))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


PARAMS = _int_params()


def test_the_walk_finds_the_int_options():
    names = {(path, max(p.opts, key=len)) for path, p in PARAMS}
    assert ("diag kv-fail", "--seed") in names and ("diag kv-fail", "--requests") in names
    assert len(PARAMS) >= 10, names


@pytest.mark.parametrize(("path", "param"), PARAMS, ids=lambda x: getattr(x, "name", x))
def test_every_int_parameter_refuses_what_is_not_a_plain_integer(path, param):
    cmd = typer.main.get_command(app)
    for word in path.split():
        cmd = cmd.commands[word]
    ctx = cmd.make_context(path, [], resilient_parsing=True)
    for text in NOT_INTEGERS:
        with pytest.raises(typer.BadParameter, match="is not an integer"):
            param.process_value(ctx, [text] if param.multiple or param.nargs != 1 else text)
    good = param.process_value(ctx, ["7"] if param.multiple or param.nargs != 1 else "7")
    assert good in (7, [7], (7,)), (path, param.name, good)


@pytest.mark.parametrize("flag", ["--seed", "--requests", "--max-tokens", "--fail-requests"])
def test_kv_fail_seed_range_is_refused_through_the_cli(flag):
    """The issue's case: exit 2, one line naming the flag; no engine started."""
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "diag", "kv-fail", flag, "0-4", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert r.stderr.splitlines()[0] == f"opsctl: error: {flag}: '0-4' is not an integer"
