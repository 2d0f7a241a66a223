"""docs/architecture.md stays true: every file and folder it names exists, the names
it gives in code spans (functions, constants) are found in the files it says hold them,
and the layer list matches tests/unit/test_layers.py's rules."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from tests.unit.test_layers import ALLOWED

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+/?)`|`([\w-]+\.(?:toml|md))`")
HELD = {  # name in the doc -> the file that must define it
    "register": "engine_patches/__init__.py",  # named as engine_patches:register
    "write_hashes": "opsctl/checks/preflight.py",
    "FLEET_TABLE": "opsctl/console/columns.py",
    "ONCE_KEYS": "opsctl/console/columns.py",
    "EngineServer": "opsctl/engine/server.py",
    "EndpointView": "opsctl/console/judge.py",
    "Report": "opsctl/checks/report.py",
    "run_app": "opsctl/ui/runner.py",
    "run_with_progress": "opsctl/ui/progress.py",
    "Check": "opsctl/domain/check_registry.py",
    "Subject": "opsctl/domain/check_registry.py",
    "WorkerApp": "opsctl/ui/worker_app.py",
    "command": "opsctl/commands/options.py",
    "two_engines": "tests/conftest.py",
}


def test_every_named_path_exists():
    named = {a or b for a, b in PATH.findall(DOC)}
    assert len(named) > 30, named
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert missing == [], missing


def test_named_functions_live_where_the_doc_says():
    for name, file in HELD.items():
        assert file in DOC or file == "engine_patches/__init__.py", file
        source = (ROOT / file).read_text()
        assert re.search(rf"^(def|class) {name}\b|^{name}(: [^=]+)? = ", source, re.M) or (
            f"def {name}(" in source
        ), (name, file)


def test_the_layers_are_the_enforced_ones():
    block = DOC.split("```")[1]
    layers = re.findall(r"->\s+(\w+)", block)
    assert layers == ["commands", "ui", "console", "checks", "engine", "collectors", "domain"]
    for upper, lower in itertools.pairwise(layers):
        assert lower in ALLOWED[upper], (upper, lower)  # each layer may use the next
        assert upper not in ALLOWED[lower], (lower, upper)  # never back up
