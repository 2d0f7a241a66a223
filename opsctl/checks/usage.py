"""The usage check's library call under the name the README documents for Python callers.

``from opsctl.checks import usage`` stays true: the check itself is the folder
opsctl/suite/usage/ (its library call is run.py there); this module only re-exports it.
"""

from opsctl.suite.usage.run import Options, Report, UsageReport, certify, on_server, outcome, run

__all__ = ["Options", "Report", "UsageReport", "certify", "on_server", "outcome", "run"]
