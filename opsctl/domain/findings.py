"""Findings and verdicts shared by every check. Pure data; rendered by CLI and TUI alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, INFO, WARNING, FAIL = "ok", "info", "warning", "fail"


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of a check: severity, stable code, one human line, and details."""

    severity: str  # ok | info | warning | fail
    code: str  # short machine-readable id, e.g. "usage.mismatch"
    message: str  # one human line
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The finding as every report's ``findings`` list holds it."""
        return asdict(self)


def verdict(findings: list[Finding] | tuple[Finding, ...]) -> str:
    """ "fail" if any finding failed, else "pass"."""
    return "fail" if any(f.severity == FAIL for f in findings) else "pass"
