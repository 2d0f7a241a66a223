"""``from opsctl.checks import invariance``, the name docs/python.md shows: a thin alias.

The check is the folder opsctl/suite/invariance/; this re-exports its library call (run.py)."""

from opsctl.suite.invariance.run import InvarianceReport, Options, certify, outcome, run

__all__ = ["InvarianceReport", "Options", "certify", "outcome", "run"]
