"""The environment an engine patch's in-process test starts from."""

from __future__ import annotations

from pathlib import Path

import pytest


def clean_patch_env(monkeypatch: pytest.MonkeyPatch, run_dir: Path, *knobs: str) -> None:
    """Point OPSCTL_RUN_DIR at ``run_dir`` and unset OPSCTL_PROBES and these knob variables.

    The patch under test then writes its ledger there and sees no probe or knob the
    test did not set itself.
    """
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(run_dir))
    for name in ("OPSCTL_PROBES", *knobs):
        monkeypatch.delenv(name, raising=False)
