"""The canary: one one-token completion with a deadline, for an engine that may hang.

The canary: one one-token completion with a deadline, as load balancers and Dynamo's
canary health checks send, for an engine whose own statistics cannot say whether it
still works (idle, or its gauges stale: a stopped EngineCore leaves /metrics at its last
values while the API server answers /health 200).

Cost (docs/cli.md): one request of a 1-token prompt and 1 generated token per look, so
vLLM's request, prompt-token and generation-token counters each move by about one; the
console's rates read it as a single request. ``status --no-canary`` and ``console
--no-canary`` turn it off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from opsctl.collectors.http import client

PROMPT = "ok"


@dataclass(frozen=True, slots=True)
class Canary:
    """What one canary request found: answered in time, hung, or answered with an error.

    ``ok``: True answered in time, False no answer within the deadline (the hang a
    canary exists for), None answered with an error (the engine answered: inconclusive)."""

    ok: bool | None
    seconds: float
    detail: str

    def to_dict(self) -> dict:
        """The canary's result as a JSON object (ok, seconds, detail)."""
        return {"ok": self.ok, "seconds": round(self.seconds, 3), "detail": self.detail}


def send(url: str, model: str, timeout: float, api_key: str | None = None) -> Canary:
    """POST one 1-token completion to ``url`` (127.0.0.1 or the operator's own URL)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    t0 = time.monotonic()
    try:
        with client(api_key, timeout=timeout) as c:
            r = c.post(f"{url.rstrip('/')}/v1/completions", json=body)
    except httpx.TimeoutException:
        took = time.monotonic() - t0
        return Canary(False, took, f"a 1-token completion did not return within {timeout:g} s")
    except httpx.HTTPError as exc:
        return Canary(None, time.monotonic() - t0, f"no answer: {type(exc).__name__}: {exc}")
    took = time.monotonic() - t0
    if r.status_code == 200:
        return Canary(True, took, f"a 1-token completion returned in {took:.2f} s")
    return Canary(None, took, f"/v1/completions answered HTTP {r.status_code} (inconclusive)")
