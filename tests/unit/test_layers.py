"""The layer graph, read from the source (every import, also those inside functions):

    entry (__main__, cli) -> commands -> checks / console / ui -> engine, collectors -> domain

- commands: Typer only; never import another command module (the shared
  commands.options is the one exception; a package __init__ registers its children);
- checks, console, engine, collectors: never import commands or ui, never typer/textual;
- ui: never imports commands or typer;
- collectors never import engine/checks/console; engine never imports checks/console;
- domain: pure (no opsctl I/O layer, no httpx/psutil/typer/textual/rich/torch/vllm);
  from engine_patches only the pure modules shared with the engine;
- engine_patches (runs inside vLLM) never imports opsctl, typer, textual or rich;
- a check's folder (opsctl/suite/<check>/) holds files of several layers, each by its
  role: ``judge*.py`` domain, ``collect*.py`` collectors, ``run*.py`` checks,
  ``flags*.py`` commands, ``view*.py`` ui; its ``__init__.py`` is the declaration, which
  nothing imports (the registry finds it) and which imports only pure modules at its
  top (the layers above only inside its loaders). A feature that is more than its check
  is a room in the same folder under the same rule: opsctl/suite/engram/ holds the
  ``opsctl engram`` commands (``flags_tables.py``, held to the command rules) beside the
  check;
- a feature that is no check is a room of its own (opsctl/stacks/, opsctl/serve/), its
  files by the same roles, its ``__init__.py`` pure (domain).
- the console (opsctl/console/) is a room whose files without a role are the console
  layer: its ``judge*.py`` files are domain, its ``view*.py`` files ui.
Also: no star imports, no import cycle anywhere in opsctl or engine_patches (every import
counts, also one inside a function), no function
over 80 lines, no command module (opsctl/commands/, a check folder's or a room's
flags*.py) over 160 lines.
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
    "declaration": {"commands", "ui", "checks", "engine", "collectors", "domain", "embedded"},
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
# a check folder's files by role (opsctl/suite/<check>/<role>*.py)
SUITE = "opsctl.suite"
ROLES = {
    "judge": "domain",
    "collect": "collectors",
    "run": "checks",
    "flags": "commands",
    "view": "ui",
}
# a feature's room: its files by role, as a check folder's (opsctl/<room>/<role>*.py)
ROOMS = ("opsctl.stacks", "opsctl.serve")
# pure modules of engine_patches that opsctl's domain shares with the engine
PURE_ENGINE_MODULES = {"engine_patches.knobs", "engine_patches.connectors.injection"}


def modules(root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def layer(module: str) -> str:
    if module.startswith("engine_patches"):
        return "engine_patches"
    if module in ("opsctl.__main__", "opsctl.cli"):
        return "entry"
    if module == SUITE or module.startswith(SUITE + "."):
        return suite_layer(module)
    if module.startswith(CONSOLE + "."):
        return console_layer(module)
    room = next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)
    if room:
        return role_layer(module, room, "domain")
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ALLOWED:
        return parts[1]
    return "base"


def suite_layer(module: str) -> str:
    """A check folder's file: its role's layer (the declaration: ``__init__.py``)."""
    check = ".".join(module.split(".")[:3])
    return role_layer(module, check, "declaration")


def role_layer(module: str, folder: str, init: str) -> str:
    """A file of a check's folder or a room by its role's layer (``init``: the folder's
    own ``__init__.py``)."""
    if module == folder:
        return init
    name = module[len(folder) + 1 :].split(".")[0]
    role = next((r for r in ROLES if name.startswith(r)), None)
    return ROLES[role] if role else f"no role ({name}: name it {', '.join(ROLES)})"


# the console's room: judge*/view* by role, its other files the console layer
CONSOLE = "opsctl.console"
CONSOLE_ROLES = {"judge": "domain", "view": "ui"}


def console_layer(module: str) -> str:
    """A file of the console's room: its role's layer, else the console layer."""
    name = module.split(".")[2]
    return next((CONSOLE_ROLES[r] for r in CONSOLE_ROLES if name.startswith(r)), "console")


def imports(path: Path, module: str, root: Path = ROOT) -> Iterator[tuple[str, int, bool, bool]]:
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
                target = sub if _is_module(sub, root) else base
                yield target, node.lineno, id(node) in top, star


def _is_module(name: str, root: Path = ROOT) -> bool:
    path = root / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


ALL = dict(modules())


def violations_of(module: str, path: Path, root: Path | None = None) -> list[str]:
    root = root or ROOT
    src = layer(module)
    if src.startswith("no role"):
        return [f"{path.relative_to(root)}: {src}"]
    out = []
    for target, line, top_level, star in imports(path, module, root):
        where = f"{path.relative_to(root)}:{line} imports {target}"
        if star:
            out.append(f"{where} (star import)")
        if src == "declaration" and top_level and not _pure(target):
            out.append(f"{where} (a declaration imports only pure modules at its top)")
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


def _pure(target: str) -> bool:
    """What a declaration may import at its top: the domain, the base, the standard library."""
    top = target.split(".")[0]
    if top != "opsctl":
        return top not in THIRD_PARTY_FORBIDDEN["domain"] and top != "engine_patches"
    return target in BASE or layer(target) == "domain"


def _command_import_ok(module: str, target: str) -> bool:
    if target in ("opsctl.commands", "opsctl.commands.options"):
        return True
    # a package __init__ imports its own children to register them
    return ALL[module].name == "__init__.py" and target.startswith(module + ".")


def test_layer_graph():
    found = [v for m, p in ALL.items() for v in violations_of(m, p)]
    assert not found, "\n".join(found)


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {imported module of opsctl/engine_patches: first line}, from every import
    statement in the file: module level, inside functions, under TYPE_CHECKING alike."""
    found = dict(modules(root))
    graph: dict[str, dict[str, int]] = {}
    for m, p in found.items():
        edges = graph.setdefault(m, {})
        for t, line, _, _ in imports(p, m, root):
            if t in found and t != m:
                edges.setdefault(t, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component of
    more than one module, in a stable order. Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))
    return [_cycle_in(graph, comp) for comp in sorted(components)]


def _cycle_in(graph: dict[str, dict[str, int]], comp: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself."""
    members, first = set(comp), comp[0]
    paths = {first: [first]}
    queue = [first]
    for v in queue:
        for w in sorted(graph[v]):
            if w == first:
                return [*paths[v], first]
            if w in members and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"no cycle through {first}")  # pragma: no cover - an SCC has one


def describe_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    return (
        " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle))
        + f" -> {cycle[-1]}"
    )


def test_no_import_cycles():
    """No cycle in opsctl or engine_patches, counting every import (also those inside
    functions: a deferred import hides a cycle, it does not remove it). No exception for
    packages: a child that imports its own package's __init__ is a cycle too."""
    graph = import_graph()
    cycles = [describe_cycle(graph, c) for c in import_cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_cycle_finder_names_a_cycle_through_a_deferred_import(tmp_path):
    """The finder sees the shape registry.py and catalog.py once had: a module-level
    import one way, an import inside a function the other way (and a longer loop)."""
    pkg = tmp_path / "engine_patches"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text("def patches():\n    from engine_patches import catalog\n")
    (pkg / "catalog.py").write_text("from engine_patches.registry import Patch\n")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("import engine_patches.c\n")
    (pkg / "c.py").write_text("def f():\n    from engine_patches.a import x\n")
    (pkg / "leaf.py").write_text("from engine_patches import registry\n")
    graph = import_graph(tmp_path)
    assert import_cycles(graph) == [
        ["engine_patches.a", "engine_patches.b", "engine_patches.c", "engine_patches.a"],
        ["engine_patches.catalog", "engine_patches.registry", "engine_patches.catalog"],
    ]
    text = describe_cycle(graph, import_cycles(graph)[1])
    assert text == (
        "engine_patches.catalog (line 1) -> engine_patches.registry (line 2) "
        "-> engine_patches.catalog"
    )


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


COMMAND_MODULES = (
    sorted((ROOT / "opsctl" / "commands").rglob("*.py"))
    + sorted((ROOT / "opsctl" / "suite").glob("*/flags*.py"))
    + sorted(f for r in ROOMS for f in (ROOT / Path(*r.split("."))).glob("flags*.py"))
)


def _command_id(path: Path) -> str:
    return path.name if "commands" in path.parts else "/".join(path.parts[-3:])


@pytest.mark.parametrize("path", COMMAND_MODULES, ids=_command_id)
def test_command_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= 160, path


def test_a_check_folder_holds_each_file_to_its_role():
    """A check's folder: the declaration, then one layer per role; any other file name is
    a violation, and a declaration's top imports only what is pure."""
    assert suite_layer("opsctl.suite.toy") == "declaration"
    roles = ("judge", "judge_tokens", "collect", "run", "flags", "view")
    assert [suite_layer(f"opsctl.suite.toy.{r}") for r in roles] == [
        "domain", "domain", "collectors", "checks", "commands", "ui",
    ]  # fmt: skip
    assert suite_layer("opsctl.suite.toy.helpers").startswith("no role")
    assert _pure("opsctl.domain.findings") and _pure("collections.abc") and _pure("opsctl.errors")
    assert not _pure("opsctl.checks.session") and not _pure("typer") and not _pure("httpx")
    assert "declaration" not in {layer for allowed in ALLOWED.values() for layer in allowed}


def test_a_room_holds_each_file_to_its_role(tmp_path):
    """A feature's room (stacks, serve): its files by role as a check folder's, its
    ``__init__.py`` pure; a judge file that reads processes is a violation."""
    assert [layer(r) for r in ROOMS] == ["domain", "domain"]
    roles = ("judge", "judge_verdict", "collect", "run", "flags", "view_app")
    assert [layer(f"opsctl.stacks.{r}") for r in roles] == [
        "domain", "domain", "collectors", "checks", "commands", "ui",
    ]  # fmt: skip
    assert layer("opsctl.serve.helpers").startswith("no role")
    assert {layer(m) for m in ALL if m.startswith(ROOMS)} == {
        "domain",
        "collectors",
        "checks",
        "commands",
        "ui",
    }
    assert {p.parent.name for p in COMMAND_MODULES if p.name == "flags.py"} >= {"stacks", "serve"}
    judge = tmp_path / "opsctl" / "serve" / "judge_state.py"
    judge.parent.mkdir(parents=True)
    judge.write_text("import psutil\n")
    (found,) = violations_of("opsctl.serve.judge_state", judge, tmp_path)
    assert found == "opsctl/serve/judge_state.py:1 imports psutil (domain may not import psutil)"


def test_the_engram_room_holds_each_file_to_its_role(tmp_path, monkeypatch):
    """opsctl/suite/engram/ is the Engram feature and its check: every file there has a
    role and is held to its layer, so a judge file of the room that imported psutil (I/O)
    would break the rule, while a collect file may."""
    room = {m.rpartition(".")[2]: layer(m) for m in ALL if m.startswith("opsctl.suite.engram.")}
    assert room["judge"] == room["judge_plan"] == room["judge_hygiene"] == "domain", room
    assert room["collect_clean"] == "collectors" and room["run_tables"] == "checks", room
    assert room["flags_tables"] == "commands" and room["view_tables"] == "ui", room
    assert not [r for r in room.values() if r.startswith("no role")], room
    room_dir = tmp_path / "opsctl" / "suite" / "engram"
    room_dir.mkdir(parents=True)
    (room_dir / "judge_plan.py").write_text("import psutil\n")
    (room_dir / "collect.py").write_text("import psutil\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert violations_of("opsctl.suite.engram.judge_plan", room_dir / "judge_plan.py") == [
        "opsctl/suite/engram/judge_plan.py:1 imports psutil (domain may not import psutil)"
    ]
    assert violations_of("opsctl.suite.engram.collect", room_dir / "collect.py") == []


def test_the_console_room_holds_each_file_to_its_role(tmp_path, monkeypatch):
    """opsctl/console/ is the console: its judge files are held to the domain's rules (a
    judge file that imported httpx would break them), its view files to the ui's, the
    rest (sources, trackers, actions) to the console layer's."""
    room = {m.rpartition(".")[2]: layer(m) for m in ALL if m.startswith("opsctl.console.")}
    assert room["judge"] == room["judge_state"] == room["judge_advisor"] == "domain", room
    assert room["view_app"] == room["view_panel"] == "ui", room
    assert room["source"] == room["actions"] == room["columns"] == "console", room
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "opsctl" / "console").mkdir(parents=True)
    found = {}
    for name in ("judge_state", "direct"):  # the same httpx import, two layers
        path = tmp_path / "opsctl" / "console" / f"{name}.py"
        path.write_text("import httpx\n")
        found[name] = violations_of(f"opsctl.console.{name}", path)
    httpx_in_judge = "opsctl/console/judge_state.py:1 imports httpx (domain may not import httpx)"
    assert found == {"judge_state": [httpx_in_judge], "direct": []}
