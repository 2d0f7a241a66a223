"""The README's command table is checked against the Typer app: every command appears in
it, every flag its ``--help`` shows appears in that command's entry, and every flag an
entry shows exists on that command (docs/cli.md). An entry is one backticked
``opsctl ...`` form in the table's first column; a row may hold several (runs list,
clean, bundle)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from opsctl.cli import build_app

README = Path(__file__).resolve().parents[2] / "README.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# shown by every command, never listed
IMPLICIT = {"--help"}


def command_tree():
    root = typer.main.get_command(build_app())

    def walk(cmd, path=()):
        yield path, cmd
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, (*path, name))

    return dict(walk(root))


TREE = command_tree()
LEAVES = {p: c for p, c in TREE.items() if not getattr(c, "commands", None)}


def help_flags(cmd) -> set[str]:
    """Every flag ``--help`` shows for ``cmd`` (hidden ones are not shown)."""
    flags = set()
    for p in cmd.params:
        if p.param_type_name == "option" and not p.hidden:
            flags |= {o for o in [*p.opts, *p.secondary_opts] if o.startswith("--")}
    return flags - IMPLICIT


def table_rows() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("| `opsctl")]


def first_cell(row: str) -> str:
    return re.split(r"(?<!\\) \| ", row[2:], maxsplit=1)[0]


def entries() -> dict[tuple[str, ...], set[str]]:
    """command path -> flags its README entries show."""
    out: dict[tuple[str, ...], set[str]] = {}
    for row in table_rows():
        for form in re.findall(r"`(opsctl[^`]*)`", first_cell(row)):
            words = form.replace("\\|", "|").split()[1:]
            path: tuple[str, ...] = ()
            for word in words:  # the longest command path the form names
                if (*path, word) in TREE:
                    path = (*path, word)
                else:
                    break
            flags = set(FLAG.findall(form.split(" -- ")[0]))  # `-- vLLM args` are not ours
            out.setdefault(path, set()).update(flags)
    return out


ENTRIES = entries()


def test_the_table_is_found_and_parsed():
    assert len(table_rows()) >= 15
    assert ("serve",) in ENTRIES and ("diag", "usage") in ENTRIES


def test_every_command_has_an_entry():
    missing = sorted(" ".join(p) for p in LEAVES if p not in ENTRIES)
    assert missing == [], f"commands missing from the README table: {missing}"


@pytest.mark.parametrize("path", sorted(ENTRIES), ids=lambda p: " ".join(p) or "opsctl")
def test_an_entry_shows_exactly_the_flags_of_help(path):
    cmd = TREE.get(path)
    assert cmd is not None, f"README names a command that does not exist: {path}"
    shown, real = ENTRIES[path], help_flags(cmd)
    if not path:  # `opsctl --version` and the completion flags: the root's own options
        assert shown <= real, shown - real
        return
    assert shown - real == set(), f"{' '.join(path)}: README shows flags --help lacks"
    assert real - shown == set(), f"{' '.join(path)}: --help flags missing from the README"


def test_the_root_entry_shows_version_and_completion():
    assert {"--version", "--install-completion", "--show-completion"} <= ENTRIES[()]
