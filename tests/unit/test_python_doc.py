"""docs/python.md's block stays true: it compiles, and every
``module.name`` it uses from opsctl.checks exists (constructing the options it shows
too, without starting an engine)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def python_block() -> str:
    return re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)


def test_use_from_python_block_names_real_entry_points():
    code = python_block()
    tree = ast.parse(code)
    modules = {
        alias.asname or alias.name: f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "opsctl.checks"
        for alias in node.names
    }
    assert {"usage", "invariance", "kv_fail", "mm_uuid", "status", "engram"} <= set(modules)
    used = {
        (n.value.id, n.attr)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules
    }
    for mod, attr in sorted(used):
        assert hasattr(importlib.import_module(modules[mod]), attr), f"{mod}.{attr}"
    for node in ast.walk(tree):  # every Options(...) the doc shows can be built as shown
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Options"):
            ns = {m: importlib.import_module(path) for m, path in modules.items()}
            eval(compile(ast.Expression(node), "<docs/python.md>", "eval"), ns)
