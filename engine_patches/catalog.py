"""The list of patches: every patch module's declarations, found by walking the package.

Every patch module under engine_patches/patches/ that defines ``PATCH`` (or
``PATCHES``) is registered, in module-name order. Adding a patch means adding a module.

The modules are imported on the first call of :func:`patches`, not when this module is
imported: a patch module imports the registry (its types and event helpers), and the
registry imports this module, so discovering at import time would run a patch module
against a half-initialised registry. This module itself imports only
:mod:`engine_patches.patch` (the types) and the patches package.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from engine_patches import patches as _pkg
from engine_patches.patch import Patch


@functools.cache
def _discover() -> tuple[Patch, ...]:
    found: list[Patch] = []
    for info in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_pkg.__name__}.{info.name}")
        found.extend(getattr(mod, "PATCHES", ()))
        if hasattr(mod, "PATCH"):
            found.append(mod.PATCH)
    return tuple(found)


def patches() -> list[Patch]:
    """Every registered patch, in module-name order (discovered once per process)."""
    return list(_discover())
