"""Every patch module under engine_patches/patches/ that defines ``PATCH`` (or
``PATCHES``) is registered, in module-name order. Adding a patch means adding a module."""

from __future__ import annotations

import importlib
import pkgutil

from engine_patches import patches as _pkg
from engine_patches.registry import Patch


def _discover() -> list[Patch]:
    found: list[Patch] = []
    for info in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_pkg.__name__}.{info.name}")
        found.extend(getattr(mod, "PATCHES", ()))
        if hasattr(mod, "PATCH"):
            found.append(mod.PATCH)
    return found


PATCHES: list[Patch] = _discover()
