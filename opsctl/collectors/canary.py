"""The canary: one one-token completion with a deadline, for an engine that may hang.

What load balancers and Dynamo's canary health checks send, for an engine whose own
statistics cannot say whether it still works (idle, or its gauges stale: a stopped
EngineCore leaves /metrics at its last values while the API server answers /health 200).

Cost (docs/cli.md): one request of a 1-token prompt and 1 generated token per look, so
vLLM's request, prompt-token and generation-token counters each move by about one; the
console's rates read it as a single request. ``status --no-canary`` and ``console
--no-canary`` turn it off.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import httpx

from opsctl.collectors.http import client
from opsctl.console.judge import Canary
from opsctl.domain.alert_rules import CANARY_BODY

PROMPT = CANARY_BODY["prompt"]  # the blackbox exporter's canary sends the same body
# vLLM's header that sends a request to one data-parallel engine (a router injects it;
# vllm/entrypoints/generate/base/serving.py _get_data_parallel_rank, 0.32)
RANK_HEADER = "X-data-parallel-rank"
__all__ = ["RANK_HEADER", "Canary", "send", "send_each"]


def send(
    url: str,
    model: str | None,
    timeout: float,
    api_key: str | None = None,
    engine: str | None = None,
) -> Canary:
    """POST one 1-token completion to ``url`` (127.0.0.1 or the operator's own URL).

    ``model`` None: no "model" in the body (vLLM answers with its first served model).
    ``engine``: the data-parallel engine (its ``engine`` label, = its DP rank) that must
    answer it, sent as ``X-data-parallel-rank``; None lets the server pick."""
    body = {**CANARY_BODY} if model is None else {"model": model, **CANARY_BODY}
    headers = {RANK_HEADER: engine} if engine is not None else None
    t0 = time.monotonic()
    try:
        with client(api_key, timeout=timeout) as c:
            r = c.post(f"{url.rstrip('/')}/v1/completions", json=body, headers=headers)
    except httpx.TimeoutException:
        took = time.monotonic() - t0
        return Canary(False, took, f"a 1-token completion did not return within {timeout:g} s")
    except httpx.HTTPError as exc:
        return Canary(None, time.monotonic() - t0, f"no answer: {type(exc).__name__}: {exc}")
    took = time.monotonic() - t0
    if r.status_code == 200:
        return Canary(True, took, f"a 1-token completion returned in {took:.2f} s")
    return Canary(None, took, f"/v1/completions answered HTTP {r.status_code} (inconclusive)")


def send_each(
    url: str, model: str | None, timeout: float, api_key: str | None, engines: Iterable[str]
) -> dict[str, Canary]:
    """One canary per data-parallel engine of ``url``, in parallel: engine -> its result."""
    from concurrent.futures import ThreadPoolExecutor

    todo = list(engines)
    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        sent = pool.map(lambda e: send(url, model, timeout, api_key, e), todo)
        return dict(zip(todo, sent, strict=True))
