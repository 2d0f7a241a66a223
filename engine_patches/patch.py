"""What a patch is: :class:`Patch` (name, target, versions, reason, apply function) and
the :class:`Outcome` its apply function returns (one of the four statuses).

A leaf module (standard library only): the patch modules, :mod:`engine_patches.catalog`
and :mod:`engine_patches.registry` all import it, and it imports none of them, so the
registry can use the catalog without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

APPLIED = "applied"
UPSTREAM = "already upstream"
SKIPPED = "skipped"
FAILED = "failed"
STATUSES = (APPLIED, UPSTREAM, SKIPPED, FAILED)


@dataclass(frozen=True)
class Outcome:
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    versions: str  # human-readable range, checked by the apply function itself
    reason: str  # upstream PR / issue
    apply: Callable[[], Outcome]
    roles: tuple[str, ...] = ("api_server", "engine_core", "worker")
