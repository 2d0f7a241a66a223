"""engram: Engram tables after the run, orphans, fill and /dev/shm (the check's declaration).

This folder is the whole Engram feature, one file per role: ``opsctl engram inspect |
plan | clean`` and certify's engram check, which is that feature's certify view (it runs
inspect, clean's dry run and plan on the server under check).

- the feature: ``judge.py`` and ``judge_plan.py`` (pure: a table's layout, fill findings,
  clean's rules; bytes per rank and node), ``collect.py``, ``collect_clean.py`` and
  ``collect_config.py`` (I/O: /dev/shm and /proc, orphans, a model's config),
  ``run_tables.py`` (the library calls ``inspect``, ``plan``, ``clean``; opsctl.checks.engram
  re-exports it for Python callers), ``flags_tables.py`` (the ``opsctl engram`` commands),
  ``view_tables.py`` (their text renderers);
- the check: ``judge_hygiene.py`` (pure: the findings for one server) and ``run.py`` (the
  library call certify makes; the registry loads it). A certify check only: no diag
  command (no ``flags.py``), no console action.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Subject


def _applies(s: Subject) -> str | None:
    if s.local:
        return None
    return "the server is not on this node: its /dev/shm and /proc are out of reach"


CHECK = Check(
    "engram",
    "Engram hygiene: no orphans, fill verified, /dev/shm capacity",
    "Engram tables: no orphans, fill verified, /dev/shm capacity.",
    order=30,
    certify=_applies,
)
