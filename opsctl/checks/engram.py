"""The Engram library calls under the name docs/python.md documents for Python callers.

``from opsctl.checks import engram`` stays true: the feature itself is the folder
opsctl/suite/engram/ (its library calls are run_tables.py there); this module only
re-exports them.
"""

from opsctl.suite.engram.run_tables import (
    CLEAN_SCHEMA,
    COLUMNS,
    INSPECT_SCHEMA,
    PLAN_SCHEMA,
    CleanOptions,
    EngramReport,
    InspectOptions,
    PlanOptions,
    clean,
    inspect,
    plan,
    table_row,
)

__all__ = [
    "CLEAN_SCHEMA",
    "COLUMNS",
    "INSPECT_SCHEMA",
    "PLAN_SCHEMA",
    "CleanOptions",
    "EngramReport",
    "InspectOptions",
    "PlanOptions",
    "clean",
    "inspect",
    "plan",
    "table_row",
]
