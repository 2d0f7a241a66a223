"""One HTTP call to a vLLM admin route; the answer, or why there was none.

opsctl.domain.admin_routes says which route and what the answer means. I/O only: never a raise."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from opsctl.collectors.http import client


@dataclass(frozen=True, slots=True)
class AdminAnswer:
    """What an admin route answered: the status, the decoded body, or why there was none."""

    status: int | None  # None: no HTTP answer
    body: object  # decoded JSON, else the text
    error: str | None = None


def call(url: str, method: str, path: str, api_key: str | None, timeout: float) -> AdminAnswer:
    """Send ``method path`` to the server at ``url``; any failure is the answer's ``error``."""
    try:
        with client(api_key, timeout=timeout) as c:
            r = c.request(method, f"{url.rstrip('/')}{path}")
    except httpx.HTTPError as exc:
        return AdminAnswer(None, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
    try:
        body: object = r.json()
    except ValueError:
        body = r.text.strip()
    return AdminAnswer(r.status_code, body)
