"""HTTP reads of the liveness check: /health, one small request, one /metrics counter.

Plain values out; every network error becomes a value with its reason, never a raise (except
a refused API key: "authentication required", exit 3)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from opsctl.collectors import http
from opsctl.domain.metrics import parse_metrics


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP read: its status, payload, error and duration."""

    status: int | None
    payload: Any
    error: str | None
    seconds: float


def health(url: str, timeout: float) -> Answer:
    """GET /health at ``url``, timed; a transport error is the answer's ``error``."""
    t0 = time.monotonic()
    try:
        with http.client(None, timeout=timeout) as c:
            r = c.get(f"{url}/health")
        return Answer(r.status_code, None, None, time.monotonic() - t0)
    except httpx.HTTPError as exc:
        return Answer(None, None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)


def post(url: str, path: str, body: dict, api_key: str | None, timeout: float) -> Answer:
    """POST ``body``; the JSON answer (or its first 200 characters of text)."""
    t0 = time.monotonic()
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = http.check_auth(c.post(f"{url}{path}", json=body), api_key)
    except httpx.TimeoutException as exc:
        return Answer(None, None, f"no answer within {timeout:g} s ({type(exc).__name__})", timeout)
    except httpx.HTTPError as exc:
        return Answer(None, None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
    try:
        payload: Any = r.json()
    except ValueError:
        payload = r.text[:200]
    error = None if r.status_code == 200 else str(payload)[:200]
    return Answer(r.status_code, payload, error, time.monotonic() - t0)


def counter(url: str, name: str, api_key: str | None, timeout: float = 10.0) -> float | None:
    """One /metrics counter summed over its label sets; None when unreadable or absent."""
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = c.get(f"{url}/metrics")
        if r.status_code != 200:
            return None
        return parse_metrics(r.text).get(name)
    except (httpx.HTTPError, ValueError):
        return None


def wait_counter_above(
    url: str, name: str, floor: float, api_key: str | None, deadline: float
) -> float | None:
    """Poll counter ``name`` until it exceeds ``floor`` or ``deadline`` passes; the last value.

    ``deadline`` is on time.monotonic; None when the counter was never readable. vLLM updates
    its counters after the answer is sent, so the first read may still show the old value."""
    value = counter(url, name, api_key)
    while (value is None or value <= floor) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = counter(url, name, api_key)
    return value
