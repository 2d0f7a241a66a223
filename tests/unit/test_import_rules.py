"""Import rules at run time: `opsctl --help` (and each command's --help) loads neither
torch nor vLLM. The layer graph itself (domain pure, engine_patches apart, commands
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
