"""/metrics of a vLLM server, parsed with prometheus_client's text parser.

Never with regexes. The client (opsctl.collectors.http.client) carries the server's API key."""

from __future__ import annotations

import time

import httpx

from opsctl.domain.metrics import MetricsSnapshot, parse_metrics

__all__ = ["MetricsSnapshot", "fetch_metrics", "parse_metrics"]


def fetch_metrics(client: httpx.Client, base_url: str) -> MetricsSnapshot:
    """The server's /metrics now, parsed; an HTTP failure is the snapshot's error."""
    now = time.time()
    try:
        r = client.get(f"{base_url}/metrics")
        r.raise_for_status()
    except httpx.HTTPError as exc:
        return MetricsSnapshot(now, {}, f"{type(exc).__name__}: {exc}")
    return parse_metrics(r.text, now)
