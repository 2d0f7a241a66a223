"""Where opsctl keeps its files: OPSCTL_HOME, else $XDG_CACHE_HOME/opsctl, else ~/.cache/opsctl."""

from __future__ import annotations

import os
from pathlib import Path


def opsctl_home() -> Path:
    """opsctl's own directory (models, runs): OPSCTL_HOME or the user's cache."""
    env = os.environ.get("OPSCTL_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opsctl"


def models_dir() -> Path:
    """Where the embedded models are built."""
    return opsctl_home() / "models"


def runs_dir() -> Path:
    """Where each run's directory (ledger, logs, records) lives."""
    return opsctl_home() / "runs"
