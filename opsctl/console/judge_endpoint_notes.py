"""What the console attaches to an endpoint: advisor advice and Prometheus alerts (data).

A leaf module: opsctl.console.judge types its views with these, and the advisor and
alert_rules, which read that module, make them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Advice:
    """One piece of advice: code, severity, message, the figures behind it, the next command."""

    code: str  # one of CODES
    severity: str  # fail | warning | info
    message: str
    figures: dict[str, Any] = field(default_factory=dict)  # what triggered it, window_s
    next: str = ""  # the command to run next

    def to_dict(self) -> dict[str, Any]:
        """The advice as the console's and advisor's reports hold it."""
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "figures": dict(self.figures),
            "next": self.next,
        }


@dataclass(frozen=True, slots=True)
class FiredAlert:
    """One alert Prometheus holds for an endpoint (any rules file, not only opsctl's)."""

    name: str
    state: str  # firing | pending
    severity: str | None
    summary: str | None
    runbook: str | None
    active_at: str | None  # RFC 3339, as Prometheus gives it
    instance: str | None
    job: str | None

    def to_dict(self) -> dict:
        """The alert as the console's report holds it (``name`` as ``alertname``)."""
        return {
            "alertname": self.name,
            "state": self.state,
            "severity": self.severity,
            "summary": self.summary,
            "runbook": self.runbook,
            "active_at": self.active_at,
            "job": self.job,
        }
