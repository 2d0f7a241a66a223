"""Write docs/reference.md: every opsctl command's ``--help``, generated, never edited.

    python docs/make_reference.py           # from the checkout's root: rewrite the file
    python docs/make_reference.py --check   # exit 1 when the file is stale

The help is rendered in-process (Typer's CliRunner) at a fixed width and without colour,
so the text depends only on the code and the Typer release (named in the file's header).
tests/unit/test_reference.py regenerates it and fails when docs/reference.md differs.
The summary table's rows (``| `opsctl diag NAME` | ...``) and certify's list of checks
(from the check registry) are what tests/unit/test_check_registry.py reads.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference.md"
WIDTH = 100
COMMAND = "python docs/make_reference.py"


def commands() -> list[tuple[tuple[str, ...], object]]:
    """Every visible command of the opsctl app, the root first, in the order --help lists them."""
    import typer

    from opsctl.cli import build_app

    root = typer.main.get_command(build_app())

    def walk(cmd, path):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name))

    return list(walk(root, ()))


def help_text(path: tuple[str, ...]) -> str:
    """``opsctl PATH --help`` as a user sees it, at WIDTH columns, no colour."""
    from typer.testing import CliRunner

    from opsctl.cli import build_app

    r = CliRunner().invoke(build_app(), [*path, "--help"], terminal_width=WIDTH, color=False)
    if r.exit_code != 0:
        raise RuntimeError(f"opsctl {' '.join(path)} --help exited {r.exit_code}: {r.output}")
    return "\n".join(line.rstrip() for line in r.stdout.strip("\n").splitlines())


def summary(path: tuple[str, ...], cmd) -> str:
    """The command's one line (its ``--help`` summary); certify's names the checks it runs."""
    text = cmd.get_short_help_str(limit=300)
    if path == ("certify",):
        from opsctl.domain import check_registry as reg

        text += f" Checks: every applicable check in one run ({', '.join(reg.names(reg.CERTIFY))})."
    return text.replace("|", "\\|")


def render() -> str:
    """The whole of docs/reference.md."""
    tree = commands()
    leaves = [(p, c) for p, c in tree if p and not getattr(c, "commands", None)]
    out = [
        "# Command reference",
        "",
        f"Generated from `opsctl ... --help` (Typer {metadata.version('typer')}, {WIDTH} columns) by",
        f"`{COMMAND}`; do not edit by hand: `tests/unit/test_reference.py` fails",
        "when this file is stale. Conventions every command follows (flags, durations, URLs,",
        "exit codes, JSON): [cli.md](cli.md).",
        "",
        "| command | what it does |",
        "| --- | --- |",
        *(f"| `opsctl {' '.join(p)}` | {summary(p, c)} |" for p, c in leaves),
        "",
    ]
    for path, _cmd in tree:
        out += [f"## {' '.join(('opsctl', *path))}", "", "```text", help_text(path), "```", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"docs/reference.md is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
