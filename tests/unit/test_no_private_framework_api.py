"""opsctl reaches no private attribute of textual, typer or vLLM (issue 36's acceptance).

Only engine_patches, which patches vLLM on purpose, may. Checked in every module of
opsctl/: no private name (or module) is imported from textual, typer, click or vllm;
and no ``obj._name`` is read where ``_name`` is private in those packages' sources but
not opsctl's own: on ``self`` inside a class, its own (or an opsctl base class's)
definition; on anything else, a definition anywhere in opsctl.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("textual", "typer", "click", "vllm")
DEFINED = re.compile(r"(?:def |class |self\.|cls\.)(_[A-Za-z]\w*)")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def framework_private_names() -> frozenset[str]:
    """Every private method, class or attribute defined in the frameworks' own sources."""
    out: set[str] = set()
    for pkg in FRAMEWORKS:
        spec = importlib.util.find_spec(pkg)
        assert spec and spec.submodule_search_locations, pkg  # installed: the scan is real
        for path in Path(next(iter(spec.submodule_search_locations))).rglob("*.py"):
            out.update(DEFINED.findall(path.read_text(errors="replace")))
    return frozenset(n for n in out if _private(n))


def _stdlib(n: ast.Attribute) -> bool:
    """``os._exit``, ``sys._getframe``: the standard library's documented ``_`` names."""
    return isinstance(n.value, ast.Name) and n.value.id in ("os", "sys")


def _defines(node: ast.AST) -> set[str]:
    """The private names a class or module body defines (methods, ``self._x =``, globals)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return {name for name in out if _private(name)}


def framework_privates(trees: list[tuple[str, ast.AST]]) -> list[str]:
    """``file:line what`` for each private framework name opsctl imports or reads."""
    theirs = framework_private_names()
    ours = set().union(*(_defines(t) for _, t in trees))
    classes = {n.name: n for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}

    def own_of(cls: ast.ClassDef) -> set[str]:
        names = _defines(cls)
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
                names |= own_of(classes[base.id])
        return names

    out = []

    def visit(node: ast.AST, rel: str, own: set[str] | None) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, ast.ClassDef):
                visit(n, rel, own_of(n))
                continue
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in FRAMEWORKS:
                parts = (n.module or "").split(".") + [a.name for a in n.names]
                if any(_private(p) for p in parts):
                    out.append(f"{rel}:{n.lineno} from {n.module} import ...")
            elif isinstance(n, ast.Import):
                for a in n.names:
                    top, *rest = a.name.split(".")
                    if top in FRAMEWORKS and any(_private(p) for p in rest):
                        out.append(f"{rel}:{n.lineno} import {a.name}")
            elif isinstance(n, ast.Attribute) and n.attr in theirs and not _stdlib(n):
                on_self = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")
                mine = own if (on_self and own is not None) else ours
                if n.attr not in mine:
                    out.append(f"{rel}:{n.lineno} .{n.attr}")
            visit(n, rel, own)

    for rel, tree in trees:
        visit(tree, rel, None)
    return out


def test_the_scan_sees_private_framework_names():
    code = (
        "from textual.app import App\n"
        "from typer.main import _typer_main_entry\n"
        "class Mine(App):\n"
        "    def go(self):\n"
        "        self._own = 1\n"
        "        return self._own, self._loop\n"
        "def f(app):\n"
        "    return app._loop\n"
    )
    found = framework_privates([("opsctl/x.py", ast.parse(code))])
    assert found == [
        "opsctl/x.py:2 from typer.main import ...",
        "opsctl/x.py:6 ._loop",
        "opsctl/x.py:8 ._loop",
    ]


def test_opsctl_reads_no_private_attribute_of_textual_typer_or_vllm():
    trees = [
        (str(p.relative_to(ROOT)), ast.parse(p.read_text()))
        for p in sorted((ROOT / "opsctl").rglob("*.py"))
    ]
    assert framework_privates(trees) == []
