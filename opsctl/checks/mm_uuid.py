"""The mm-uuid check's library call under the name the README documents for Python callers.

``from opsctl.checks import mm_uuid`` stays true: the check itself is the folder
opsctl/suite/mm_uuid/ (its library call is run.py there); this module only re-exports it.
"""

from opsctl.suite.mm_uuid.run import (
    MmUuidReport,
    Options,
    Report,
    certify,
    on_server,
    outcome,
    run,
)

__all__ = ["MmUuidReport", "Options", "Report", "certify", "on_server", "outcome", "run"]
