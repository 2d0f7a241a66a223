"""``from opsctl.checks import kv_fail``, the name docs/python.md shows: a thin alias.

The check is the folder opsctl/suite/kv_fail/; this re-exports its library call (run.py)."""

from opsctl.suite.kv_fail.run import KvFailReport, Options, certify, outcome, run

__all__ = ["KvFailReport", "Options", "certify", "outcome", "run"]
