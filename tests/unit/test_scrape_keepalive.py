"""opsctl's HTTP clients never send on a connection idle long enough for vLLM's server to
close it (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): such a send reads ReadError('').

A real TCP server counts connections and never closes them, so a reuse after the expiry
would show as one connection."""

import asyncio
import time

import pytest

from opsctl.collectors import http
from opsctl.collectors.scrape import new_client

BODY = b"ok"
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
VLLM_KEEPALIVE_S = 5.0  # uvicorn's timeout_keep_alive as vLLM sets it by default


async def _serve(connections: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("kind", ["async scrape client", "sync check client"])
def test_idle_connections_expire_before_the_servers_keepalive(kind):
    assert http.KEEPALIVE_EXPIRY_S < VLLM_KEEPALIVE_S / 2

    async def main() -> list[int]:
        connections: list[int] = []
        server = await _serve(connections)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
        if kind == "async scrape client":
            client = new_client()

            async def get(times: int) -> None:
                for _ in range(times):
                    assert (await client.get(url)).text == "ok"

            async def close() -> None:
                await client.aclose()
        else:
            sync = http.client()

            async def get(times: int) -> None:
                for _ in range(times):
                    assert (await asyncio.to_thread(sync.get, url)).text == "ok"

            async def close() -> None:
                sync.close()

        seen = []
        async with server:
            await get(2)  # back to back: the connection is pooled and reused
            seen.append(len(connections))
            idle_from = time.monotonic()
            await asyncio.sleep(http.KEEPALIVE_EXPIRY_S + 0.5)
            assert time.monotonic() - idle_from > http.KEEPALIVE_EXPIRY_S
            await get(1)  # idle past the expiry: a new connection
            seen.append(len(connections))
            await close()
        return seen

    assert asyncio.run(main()) == [1, 2]
