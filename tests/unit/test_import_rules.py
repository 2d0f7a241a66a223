"""Import rules: `opsctl --help` stays instant (no torch/vllm); domain code is pure;
engine_patches never pulls in the UI or CLI stack."""

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
    "argv", [["--help"], ["serve", "--help"], ["diag", "--help"], ["engram", "--help"]]
)
def test_help_imports_neither_torch_nor_vllm(argv):
    code = (
        "import sys\nfrom opsctl.__main__ import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    )
    mods = modules_after(code)
    assert "opsctl.cli" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}


def test_domain_is_pure():
    mods = modules_after(
        "import pkgutil, importlib, opsctl.domain as d\n"
        "[importlib.import_module(f'opsctl.domain.{m.name}') for m in pkgutil.iter_modules(d.__path__)]"
    )
    forbidden = (*HEAVY, "textual", "typer", "httpx", "psutil")
    assert not {m for m in mods if m.split(".")[0] in forbidden}
    assert not {
        m for m in mods if m.startswith(("opsctl.collectors", "opsctl.ui", "opsctl.commands"))
    }


def test_engine_patches_do_not_import_ui_or_cli():
    mods = modules_after("import engine_patches, engine_patches.registry, engine_patches.catalog")
    assert not {
        m for m in mods if m.split(".")[0] in ("textual", "typer") or m.startswith("opsctl.ui")
    }
