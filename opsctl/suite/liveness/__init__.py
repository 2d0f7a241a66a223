"""liveness: /health, one request and forward progress (the check's declaration).

Its code: the run opsctl.checks.liveness, its I/O opsctl.collectors.liveness, its
judgement opsctl.domain.certify_checks.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Parts


def _load() -> Parts:
    from opsctl.checks import liveness

    return Parts.of(liveness)


CHECK = Check(
    "liveness",
    "liveness: /health, one request, forward progress",
    "/health, one request and forward progress in /metrics.",
    order=10,
    load=_load,
    certify=lambda s: None,  # every target: it is how certify knows one answers
)
