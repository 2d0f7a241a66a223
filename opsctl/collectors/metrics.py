"""HTTP collectors for a vLLM server: /health, /version, /v1/models, /metrics.

/metrics is parsed with prometheus_client's text parser, never with regexes. The client
(opsctl.collectors.http.client) carries the server's API key; a 401/403 from a guarded
endpoint is recorded in ``HealthSnapshot.auth_refused``, never raised.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import httpx

from opsctl.collectors.http import AUTH_STATUSES
from opsctl.domain.metrics import MetricsSnapshot, parse_metrics

__all__ = ["HealthSnapshot", "MetricsSnapshot", "fetch_health", "fetch_metrics", "parse_metrics"]


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    url: str
    taken_at: float
    healthy: bool
    status_code: int | None
    version: str | None
    models: tuple[str, ...]
    error: str | None = None
    # HTTP status (401/403) of the endpoint that refused our credentials, if one did
    # (vLLM guards /v1/... with --api-key and leaves /health open)
    auth_refused: int | None = None


def fetch_metrics(client: httpx.Client, base_url: str) -> MetricsSnapshot:
    now = time.time()
    try:
        r = client.get(f"{base_url}/metrics")
        r.raise_for_status()
    except httpx.HTTPError as exc:
        return MetricsSnapshot(now, {}, f"{type(exc).__name__}: {exc}")
    return parse_metrics(r.text, now)


def fetch_health(client: httpx.Client, base_url: str) -> HealthSnapshot:
    now = time.time()
    try:
        r = client.get(f"{base_url}/health")
    except httpx.HTTPError as exc:
        return HealthSnapshot(base_url, now, False, None, None, (), f"{type(exc).__name__}: {exc}")
    version = None
    models: tuple[str, ...] = ()
    refused = r.status_code if r.status_code in AUTH_STATUSES else None
    if r.status_code == 200:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            version = client.get(f"{base_url}/version").json().get("version")
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            m = client.get(f"{base_url}/v1/models")
            if m.status_code in AUTH_STATUSES:
                refused = m.status_code
            else:
                models = tuple(x["id"] for x in m.json().get("data", []))
    return HealthSnapshot(
        base_url, now, r.status_code == 200, r.status_code, version, models, None, refused
    )
