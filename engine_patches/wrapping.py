"""How a patch module replaces vLLM callables and undoes it, the way every module does.

- :func:`requested`: whether ``OPSCTL_PROBES`` asks for a probe (probes are inert
  otherwise);
- :class:`Originals`: the callables a module replaced, each installed at most once per
  process (a mark on the wrapper says it is ours) and restored by ``restore()`` (tests);
- :func:`decide_upstream`: the outcome of a patch's upstream rule on the installed
  sources, when the rule says there is nothing to apply.

A leaf module (standard library and :mod:`engine_patches.patch` only): it runs inside
every vLLM process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from engine_patches.patch import (
    APPLIED,
    SKIPPED,
    UPSTREAM,
    Outcome,
    UpstreamRule,
    installed_sources,
)

PROBES = "OPSCTL_PROBES"
ALREADY = Outcome(APPLIED, "already applied in this process")  # vLLM loaded plugins again


def requested(probe: str, env: Mapping[str, str] | None = None, *, every: bool = False) -> bool:
    """Whether ``OPSCTL_PROBES`` (comma-separated) names ``probe``.

    ``all`` counts too where ``every`` says the probe honours it."""
    raw = (env if env is not None else os.environ).get(PROBES, "")
    names = {p.strip() for p in raw.split(",")}
    return probe in names or (every and "all" in names)


def wrapped_by(fn: Any, mark: str, value: Any = True) -> bool:
    """Whether ``fn`` or a callable it wraps carries ``mark`` set to ``value``.

    The chain is followed through ``__wrapped__`` (two patches may stack on one
    method under one mark name)."""
    seen = 0
    while fn is not None and seen < 16:
        if getattr(fn, mark, None) == value:
            return True
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return False


class Originals(dict):
    """The callables a patch module replaced: key -> (owner, attribute, original).

    A dict, so a module can still look an original up by its key (``batch_gate`` calls
    the original ``add_request`` it wrapped)."""

    def wrap(
        self,
        owner: Any,
        attr: str,
        wrapper: Callable[[Any], Any],
        mark: str,
        *,
        value: Any = True,
        key: Any = None,
    ) -> bool:
        """Replace ``owner.attr`` with ``wrapper(current)`` once.

        Nothing happens when it is ours already (``mark`` set to ``value`` on it or
        along its chain); the wrapper gets the mark. False when it was ours
        (idempotent: vLLM may load plugins more than once)."""
        current = getattr(owner, attr)
        if wrapped_by(current, mark, value):
            return False
        # the owner's own entry (a classmethod stays one), else the inherited callable
        self[attr if key is None else key] = (owner, attr, vars(owner).get(attr, current))
        new = wrapper(current)
        setattr(new, mark, value)
        setattr(owner, attr, new)
        return True

    def original(self, key: Any) -> Any:
        """The original callable kept under ``key`` (None when nothing is kept)."""
        kept = self.get(key)
        return None if kept is None else kept[2]

    def restore(self) -> None:
        """Put every original back, the last replaced first, and forget them (tests)."""
        for key in reversed(list(self)):
            owner, attr, original = self.pop(key)
            setattr(owner, attr, original)


def decide_upstream(
    rule: UpstreamRule, names: Iterable[str], sources: Mapping[str, str | None] | None = None
) -> tuple[Outcome | None, str]:
    """(outcome, why) of an upstream rule on the installed sources.

    The sources of ``names`` (or ``sources``). Skipped when the rule cannot decide (a target
    is gone), already upstream when the fix is there, None when the patch is to be applied."""
    handled, why = rule(installed_sources(names) if sources is None else sources)
    return settled(handled, why), why


def settled(handled: bool | None, why: str) -> Outcome | None:
    """The outcome of an upstream verdict that leaves nothing to apply, or None.

    Skipped when it cannot decide (None), already upstream when the fix is there;
    None to apply."""
    if handled is None:
        return Outcome(SKIPPED, why)
    if handled:
        return Outcome(UPSTREAM, why)
    return None
