"""liveness: /health, one request and forward progress (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a
surface needs it): ``judge.py`` (pure: the findings), ``collect.py`` (HTTP: /health,
the request, one /metrics counter), ``run.py`` (the library call certify makes). A
certify check only: no diag command, no console action.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check

CHECK = Check(
    "liveness",
    "liveness: /health, one request, forward progress",
    "/health, one request and forward progress in /metrics.",
    order=10,
    certify=lambda s: None,  # every target: it is how certify knows one answers
)
