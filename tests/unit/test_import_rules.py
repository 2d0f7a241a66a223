"""Import rules at run time: `opsctl --help` (and each command's --help) loads neither
torch nor vLLM; the engine plugin with every patch module loads nothing of opsctl. The layer graph itself (domain pure, engine_patches apart, commands
thin, ...) is read from the source in tests/unit/test_layers.py."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "vllm")


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["serve", "--help"],
        ["diag", "--help"],
        ["engram", "--help"],
        ["runs", "--help"],
        ["console", "--help"],
        ["status", "--help"],
        ["models", "--help"],
        ["patches", "--help"],
    ],
)
def test_help_imports_neither_torch_nor_vllm(argv):
    code = (
        "import sys\nfrom opsctl.__main__ import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    )
    mods = modules_after(code)
    assert "opsctl.cli" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}


def test_engine_plugin_loads_apart_from_opsctl():
    """What vLLM loads in every process: the plugin, the registry and every patch module
    the catalog discovers (importlib, which the static graph in test_layers cannot follow)
    import nothing of opsctl, typer, textual or rich; discovery runs after the registry
    is fully imported (no cycle at run time either)."""
    code = (
        "from engine_patches import registry\n"
        "names = [p.name for p in registry.patches()]\n"
        "assert 'dummy_constant_fill' in names, names\n"
    )
    mods = modules_after(code)
    assert {m for m in mods if m.startswith("engine_patches.patches.")} >= {
        "engine_patches.patches.dummy_fill",
        "engine_patches.patches.engine_info",
    }
    forbidden = {"opsctl", "typer", "textual", "rich"}
    assert not {m for m in mods if m.split(".")[0] in forbidden}
