"""The console's keep-alive GET client (opsctl.collectors.fastget) against a REAL vLLM
server (the session pool's tiny-llama: this module only reads from it): the same
snapshot as through httpx (/health, /metrics parsed, /version, /v1/models), polls kept
on one connection, and uvicorn's idle close coming later than the client's own expiry
(so the client never sends on a connection the server is about to close), after which
the next poll opens a new connection without a failed request."""

from __future__ import annotations

import asyncio
import time

import pytest

from opsctl.checks.target import EngineSpec
from opsctl.collectors import fastget, scrape

pytestmark = [pytest.mark.engine, pytest.mark.pool("tiny-llama")]


@pytest.fixture(scope="module")
def engine(engine_pool):
    from tests.engine_pool import SPECS

    spec = None if "tiny-llama" in SPECS else EngineSpec("tiny-llama")
    return engine_pool.engine("tiny-llama", spec)


def test_fast_and_httpx_read_the_same_snapshot(engine):
    async def main():
        out = []
        for fast in (True, False):
            async with scrape.Poller(engine.url, None, 30.0, fast=fast) as poller:
                assert (poller.fast is not None) is fast
                out.append(await poller.scrape(want_info=True))
                assert (poller.fast is not None) is fast  # no answer made it fall back
        return out

    a, b = asyncio.run(main())
    assert a.health.status == b.health.status == 200
    assert a.metrics.status == b.metrics.status == 200
    assert a.samples is not None and b.samples is not None
    assert a.samples.vllm_series == b.samples.vllm_series > 0
    assert a.samples.values.keys() == b.samples.values.keys()
    assert a.samples.buckets.keys() == b.samples.buckets.keys()
    assert a.info is not None and b.info is not None
    assert a.info.version == b.info.version and a.info.version
    assert a.info.models == b.info.models and a.info.models
    assert a.info.fetched_at is not None and a.auth is None


def test_polls_share_one_connection_until_the_servers_idle_close(engine):
    async def main() -> tuple[int, float, int, int]:
        async with fastget.Client(engine.url) as client:
            for _ in range(5):
                assert (await client.get("/health")).status_code == 200
                assert (await client.get("/metrics")).status_code == 200
            kept = client.connects
            conn = client.idle[0]
            async with asyncio.timeout(60):  # uvicorn's keep-alive (vLLM: 5 s by default)
                while not conn.closed:
                    await asyncio.sleep(0.05)
            idle_when_closed = time.monotonic() - conn.idle_since
            assert (await client.get("/metrics")).status_code == 200
            return kept, idle_when_closed, client.connects, client.retries

    kept, idle_when_closed, connects, retries = asyncio.run(main())
    assert kept == 1  # ten requests, one connection
    assert idle_when_closed > fastget.IDLE_S  # the server closes later than we stop reusing
    assert connects == 2 and retries == 0
