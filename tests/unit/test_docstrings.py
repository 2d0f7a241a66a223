"""Every public module, class and function of opsctl/ and engine_patches/ opens its
docstring with a one-line summary (issue 36 item 7): the first line is a sentence of its
own (it ends in ``.``, ``!``, ``?``, ``:`` or ``)``) and, where more follows, a blank line
comes next. Public: a name without a leading underscore, at module level or in a public
class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("opsctl", "engine_patches")
ENDS = ".!?:)"


def summary_problem(doc: str | None) -> str | None:
    """Why ``doc`` lacks a one-line summary (None: it has one)."""
    if not doc or not doc.strip():
        return "no docstring"
    lines = doc.strip("\n").splitlines()
    first = lines[0].strip()
    if not first or first[-1] not in ENDS:
        return f"first line is not a sentence of its own: {first[:60]!r}"
    if len(lines) > 1 and lines[1].strip():
        return "no blank line after the summary"
    return None


def offenders(path: Path) -> list[str]:
    """``path:line name: why`` for each public item of ``path`` without a summary."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT)
    out = []
    why = summary_problem(ast.get_docstring(tree))
    if why:
        out.append(f"{rel}:1 <module>: {why}")

    def visit(node: ast.AST, prefix: str) -> None:
        for n in ast.iter_child_nodes(node):
            if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if n.name.startswith("_"):
                continue
            why = summary_problem(ast.get_docstring(n))
            if why:
                out.append(f"{rel}:{n.lineno} {prefix}{n.name}: {why}")
            if isinstance(n, ast.ClassDef):
                visit(n, f"{prefix}{n.name}.")

    visit(tree, "")
    return out


def test_the_rule_tells_a_summary_from_a_paragraph():
    assert summary_problem("Start the engine.") is None
    assert summary_problem("Start the engine.\n\nMore words.") is None
    assert summary_problem("Start the engine and\nwait for it.") is not None
    assert summary_problem("Start the engine.\nMore words.") is not None
    assert summary_problem(None) == "no docstring"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_item_has_a_one_line_summary(package):
    bad = [o for p in sorted((ROOT / package).rglob("*.py")) for o in offenders(p)]
    assert bad == [], f"{len(bad)} without a one-line summary:\n" + "\n".join(bad[:50])
