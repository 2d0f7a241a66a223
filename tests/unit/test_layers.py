"""The layer graph, read from the source (every import, also those inside functions):

    entry (__main__, cli) -> commands -> checks / console / ui -> engine, collectors -> domain

- commands: Typer only; never import another command module (the shared
  commands.options is the one exception; a package __init__ registers its children);
- checks, console, engine, collectors: never import commands or ui, never typer/textual;
- ui: never imports commands or typer;
- collectors never import engine/checks/console; engine never imports checks/console;
- domain: pure (no opsctl I/O layer, no httpx/psutil/typer/textual/rich/torch/vllm);
  from engine_patches only the pure modules shared with the engine;
- engine_patches (runs inside vLLM) never imports opsctl, typer, textual or rich.
Also: no star imports, no import cycles between opsctl modules at import time, no function
over 80 lines, no command module over 160 lines.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("opsctl", "engine_patches")

# layer -> opsctl layers it may import (besides itself and the base modules)
BASE = {"opsctl.errors", "opsctl.exit_codes", "opsctl.paths", "opsctl.output", "opsctl"}
ALLOWED = {
    "entry": {"commands", "engine", "checks", "console", "ui", "collectors", "domain"},
    "commands": {"checks", "console", "ui", "engine", "collectors", "domain", "embedded"},
    "ui": {"checks", "console", "engine", "collectors", "domain", "embedded"},
    "console": {"checks", "engine", "collectors", "domain", "embedded"},
    "checks": {"engine", "collectors", "domain", "embedded"},
    "engine": {"collectors", "domain", "embedded"},
    "collectors": {"domain", "embedded"},
    "embedded": {"domain"},
    "domain": set(),
    "base": {"domain"},
}
THIRD_PARTY_FORBIDDEN = {
    "domain": {"httpx", "psutil", "typer", "textual", "rich", "torch", "vllm"},
    "checks": {"typer", "textual"},
    "console": {"typer", "textual"},
    "engine": {"typer", "textual"},
    "collectors": {"typer", "textual"},
    "ui": {"typer"},
    "engine_patches": {"typer", "textual", "rich", "opsctl"},
}
# pure modules of engine_patches that opsctl's domain shares with the engine
PURE_ENGINE_MODULES = {"engine_patches.knobs", "engine_patches.connectors.injection"}


def modules() -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def layer(module: str) -> str:
    if module.startswith("engine_patches"):
        return "engine_patches"
    if module in ("opsctl.__main__", "opsctl.cli"):
        return "entry"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ALLOWED:
        return parts[1]
    return "base"


def imports(path: Path, module: str) -> Iterator[tuple[str, int, bool, bool]]:
    """(imported module, line, at module level?, star?) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top = set(map(id, tree.body))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top, False
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            star = any(a.name == "*" for a in node.names)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if _is_module(sub) else base
                yield target, node.lineno, id(node) in top, star


def _is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


ALL = dict(modules())


def violations_of(module: str, path: Path) -> list[str]:
    src = layer(module)
    out = []
    for target, line, _, star in imports(path, module):
        where = f"{path.relative_to(ROOT)}:{line} imports {target}"
        if star:
            out.append(f"{where} (star import)")
        top = target.split(".")[0]
        if top in THIRD_PARTY_FORBIDDEN.get(src, ()) and not (
            src == "domain" and target in PURE_ENGINE_MODULES
        ):
            out.append(f"{where} ({src} may not import {top})")
        if src == "domain" and top == "engine_patches" and target not in PURE_ENGINE_MODULES:
            out.append(f"{where} (domain may import only the pure engine_patches modules)")
        if top != "opsctl" or src == "engine_patches":
            continue
        dst = layer(target)
        if dst == src or target in BASE or dst in ALLOWED[src]:
            if src == "commands" and dst == "commands" and not _command_import_ok(module, target):
                out.append(f"{where} (a command module imports another command module)")
            continue
        out.append(f"{where} ({src} may not import {dst})")
    return out


def _command_import_ok(module: str, target: str) -> bool:
    if target in ("opsctl.commands", "opsctl.commands.options"):
        return True
    # a package __init__ imports its own children to register them
    return ALL[module].name == "__init__.py" and target.startswith(module + ".")


def test_layer_graph():
    found = [v for m, p in ALL.items() for v in violations_of(m, p)]
    assert not found, "\n".join(found)


def test_no_import_cycles_at_import_time():
    graph = {
        m: {t for t, _, at_top, _ in imports(p, m) if at_top and t in ALL and t != m}
        for m, p in ALL.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            # a package importing its submodule and back is Python's normal way
            assert cycle is None or _package_only(cycle), " -> ".join(cycle or [])


def _package_only(cycle: list[str]) -> bool:
    return all(a.startswith(b) or b.startswith(a) for a, b in itertools.pairwise(cycle))


def long_functions(limit: int = 80) -> list[tuple[int, str]]:
    out = []
    for module, path in ALL.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((n, f"{module}.{node.name} ({path.name}:{node.lineno})"))
    return sorted(out, reverse=True)


def test_no_function_over_80_lines():
    assert long_functions() == []


@pytest.mark.parametrize(
    "path", sorted((ROOT / "opsctl" / "commands").rglob("*.py")), ids=lambda p: p.name
)
def test_command_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= 160, path
