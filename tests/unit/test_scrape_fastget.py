"""The console's keep-alive GET client (opsctl.collectors.fastget).

Framing is pure logic: every answer below is fed to one connection whole, split at every
byte offset, and byte by byte (partial reads), and must give the same status and body.
The connection handling runs against real TCP servers on 127.0.0.1 that count
connections and requests: kept connections, Connection: close, bodies ended by the
close, a server closing an idle connection, a close racing a request (sent once more on
a fresh connection) against a request that got part of an answer (never sent again),
timeouts, refused ports. Last, the scraper on top: the fallback to httpx on an answer
this client does not handle, and the deadline shared by /health and /metrics."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest

from opsctl.collectors import fastget, scrape
from tests.standins.vllm_server import METRICS

REQ = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def _answer(pieces: list[bytes], eof: bool = False):
    """One request on a connection fed ``pieces``; (response or exception, connection)."""
    conn = fastget._Conn()
    conn.connection_made(_Transport())
    task = asyncio.ensure_future(conn.request(REQ))
    await asyncio.sleep(0)  # let the request reach its await (a yield, not a wait)
    for piece in pieces:
        conn.data_received(piece)
    if eof:
        conn.eof_received()
    if conn.waiter is not None and not conn.waiter.done():  # no whole answer: stop there
        task.cancel()
    try:
        return await task, conn
    except (fastget.HTTPError, fastget.Unsupported, asyncio.CancelledError) as exc:
        return exc, conn


def _splits(raw: bytes) -> list[list[bytes]]:
    return (
        [[raw]]
        + [[raw[:i], raw[i:]] for i in range(1, len(raw))]
        + [[raw[i : i + 1] for i in range(len(raw))]]
    )


def _chunked(body: bytes, size: int, ext: bool = False, trailer: bool = False) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += b"%x%s\r\n%s\r\n" % (len(part), b";x=y" if ext else b"", part)
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


BODY = b"vllm:num_requests_running 4.0\nvllm:gpu_cache_usage_perc 0.5\n"
FRAMINGS = {
    "content-length": (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
                       200, BODY, True, False),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 7),
                200, BODY, True, False),
    "chunked, extension and trailer": (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"
        + _chunked(BODY, 16, ext=True, trailer=True), 200, BODY, True, False),
    "empty 204": (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True, False),
    "empty health": (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", 200, b"", True, False),
    "100 continue first": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\nno",
        401, b"no", True, False),
    "100 continue, then a body ended by the close": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n" + BODY, 200, BODY, False, True),
    "connection: close": (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
        200, BODY, False, False),
    "http/1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
                 200, BODY, False, False),
    "ended by the close": (b"HTTP/1.1 200 OK\r\n\r\n" + BODY, 200, BODY, False, True),
    "gzip": (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
             % (len(gzip.compress(BODY)), gzip.compress(BODY)), 200, BODY, True, False),
    "deflate": (b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s"
                % (len(zlib.compress(BODY)), zlib.compress(BODY)), 200, BODY, True, False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(FRAMINGS))
def test_framing_whole_split_anywhere_and_byte_by_byte(name):
    raw, status, body, keep, eof = FRAMINGS[name]

    async def main() -> None:
        for pieces in _splits(raw):
            r, conn = await _answer(pieces, eof=eof)
            assert isinstance(r, fastget.Response), (name, pieces[:3], r)
            assert (r.status_code, r.content) == (status, body), pieces[:3]
            assert conn.closed is (not keep)  # kept for the next request, or closed

    asyncio.run(main())


BAD = {
    "not http": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", fastget.RemoteProtocolError),
    "bad content-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", fastget.RemoteProtocolError),
    "conflicting content-length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        fastget.RemoteProtocolError),
    "bad chunk size": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                       fastget.RemoteProtocolError),
    "negative chunk size": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
                            fastget.RemoteProtocolError),
    "chunk without its CRLF": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
                               fastget.RemoteProtocolError),
    "gzip, chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                      fastget.Unsupported),
    "brotli": (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n",
               fastget.Unsupported),
    "upgrade": (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
                fastget.Unsupported),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BAD))
def test_answers_it_does_not_take_fail_and_close_the_connection(name):
    raw, error = BAD[name]
    r, conn = asyncio.run(_answer([raw]))
    assert isinstance(r, error) and conn.closed, r


def test_a_close_mid_answer_is_a_read_error_and_before_any_byte_says_unanswered():
    cut = FRAMINGS["content-length"][0][:-5]
    r, _ = asyncio.run(_answer([cut], eof=True))
    assert type(r) is fastget.ReadError and "mid-answer" in str(r)
    r, _ = asyncio.run(_answer([], eof=True))
    assert isinstance(r, fastget._Unanswered)  # the only kind ever sent again


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://localhost:8000/prefix", True),
        ("http://[::1]:8000", True),
        ("https://127.0.0.1:8000", False),
        ("http://user:pw@127.0.0.1:8000", False),
        ("http://127.0.0.1:8000/?x=1", False),
        ("http://127.0.0.1:99999", False),
    ],
)
def test_which_urls_it_takes(url, ok, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert fastget.usable(url) is ok


@pytest.mark.parametrize(
    ("url", "key"),
    [("http://127.0.0.1:9/a b", None), ("http://127.0.0.1:9", "k\r\nX-Evil: 1"),
     ("http://127.0.0.1:9", "kéy"), ("http://127.0.0.1:9/é", None)],
)  # fmt: skip
def test_a_path_or_key_it_would_not_send_as_it_is_goes_to_httpx(url, key):
    with pytest.raises(fastget.Unsupported):
        fastget.Client(url, {"Authorization": f"Bearer {key}"} if key else None)
    assert scrape.Poller(url, key).fast is None


def test_a_proxy_in_the_environment_sends_it_to_httpx_unless_bypassed(monkeypatch):
    for var in ("HTTP_PROXY", "all_proxy", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    assert not fastget.usable("http://10.0.0.5:8000")
    assert scrape.Poller("http://10.0.0.5:8000").fast is None
    monkeypatch.setenv("no_proxy", "10.0.0.5")
    assert fastget.usable("http://10.0.0.5:8000")


# ---- real sockets ------------------------------------------------------------------------


def _ok(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(body), body)


class Server:
    """A TCP server on 127.0.0.1 answering each request by ``script(path, n)`` (n: the
    request's number on its connection, from 0): bytes to send, then "close", "hang" or
    nothing (keep the connection). Counts connections and requests (heads as read)."""

    def __init__(self, script) -> None:
        self.script = script
        self.connections = 0
        self.heads: list[bytes] = []
        self.open = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader, writer) -> None:
        self.connections += 1
        self.open += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                path = head.split(b" ")[1].decode()
                data, then = self.script(path, n)
                n += 1
                if data:
                    writer.write(data)
                    await writer.drain()
                if then == "close":
                    break
                if then == "hang":
                    await reader.read()  # until the client closes
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


async def _until(cond, timeout: float = 10.0, what: str = "condition") -> None:
    """A condition with a deadline, on the running loop."""
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)
    assert cond(), what


def test_a_connection_is_kept_across_polls_with_its_headers():
    async def main() -> None:
        async with Server(lambda path, n: (_ok(), None)) as srv:
            client = fastget.Client(srv.url + "/", {"Authorization": "Bearer k"})
            for path in ("/health", "/metrics", "/health", "/metrics"):
                assert (await client.get(path)).content == BODY
            assert srv.connections == 1 == client.connects
            host = srv.url.removeprefix("http://").encode()
            assert srv.heads[1] == (
                b"GET /metrics HTTP/1.1\r\nHost: %s\r\nUser-Agent: opsctl\r\n"
                b"Accept: */*\r\nAuthorization: Bearer k\r\n\r\n" % host
            )
            await client.aclose()
            await _until(lambda: srv.open == 0, what="the server to see the close")

    asyncio.run(main())


def test_chunked_and_gzip_answers_one_after_the_other_on_a_kept_connection():
    """Nothing of one answer leaks into the next (the chunked body, the coding)."""
    chunked = FRAMINGS["chunked"][0]
    zipped = FRAMINGS["gzip"][0].replace(b"Content-Encoding: gzip", b"Content-Encoding: GZIP")
    answers = [chunked, zipped, chunked, _ok(b"last")]

    async def main() -> None:
        script = lambda path, n: (answers[n], None)  # noqa: E731
        async with Server(script) as srv, fastget.Client(srv.url) as client:
            got = [(await client.get("/metrics")).content for _ in answers]
            assert got == [BODY, BODY, BODY, b"last"] and client.connects == 1

    asyncio.run(main())


def test_a_bad_body_ended_by_the_close_is_an_error_not_a_crash():
    raw = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\nnot gzip"
    r, conn = asyncio.run(_answer([raw], eof=True))
    assert isinstance(r, fastget.RemoteProtocolError) and conn.closed


def test_a_url_path_prefix_is_kept():
    async def main() -> None:
        async with (
            Server(lambda path, n: (_ok(path.encode()), None)) as srv,
            fastget.Client(srv.url + "/vllm/") as client,
        ):
            assert (await client.get("/metrics")).content == b"/vllm/metrics"

    asyncio.run(main())


@pytest.mark.parametrize(
    "answer",
    [
        _ok(extra=b"Connection: close\r\n"),
        b"HTTP/1.1 200 OK\r\n\r\n" + BODY,  # no length: the close ends the body
    ],
    ids=["connection-close", "body-ended-by-close"],
)
def test_an_answer_that_ends_the_connection_gets_a_new_one_next(answer):
    async def main() -> None:
        async with (
            Server(lambda path, n: (answer, "close")) as srv,
            fastget.Client(srv.url) as client,
        ):
            for _ in range(3):
                assert (await client.get("/metrics")).content == BODY
            assert srv.connections == 3 == client.connects and client.retries == 0

    asyncio.run(main())


def test_an_idle_connection_the_server_closed_is_not_used_again():
    """uvicorn closes a connection idle for its keep-alive timeout (vLLM: 5 s); here the
    server closes right after answering, the client sees the close, and opens a new
    connection without sending anything on the closed one."""

    async def main() -> None:
        async with (
            Server(lambda path, n: (_ok(), "close")) as srv,
            fastget.Client(srv.url) as client,
        ):
            assert (await client.get("/health")).status_code == 200
            await _until(lambda: srv.open == 0 and client.idle[0].closed, what="the close")
            assert (await client.get("/health")).status_code == 200
            assert srv.connections == 2 and len(srv.heads) == 2 and client.retries == 0

    asyncio.run(main())


def test_an_idle_connection_past_the_expiry_is_not_used_again():
    async def main() -> None:
        async with Server(lambda path, n: (_ok(), None)) as srv, fastget.Client(srv.url) as client:
            await client.get("/health")
            client.idle[0].idle_since -= fastget.IDLE_S - 0.5  # younger: kept
            await client.get("/health")
            assert client.connects == 1
            client.idle[0].idle_since -= fastget.IDLE_S  # older than the expiry
            await client.get("/health")
            assert client.connects == 2 == srv.connections
            await _until(lambda: srv.open == 1, what="the expired one closed")

    asyncio.run(main())


def test_a_close_that_races_the_request_is_sent_once_more_on_a_fresh_connection():
    """The server reads the second request of a kept connection and closes it without a
    byte of answer (its keep-alive timer fired as the request left): never answered, so
    sent again on a new connection, once."""

    async def main() -> None:
        script = lambda path, n: (_ok(), None) if n == 0 else (b"", "close")  # noqa: E731
        async with Server(script) as srv, fastget.Client(srv.url) as client:
            await client.get("/health")
            r = await client.get("/metrics")
            assert r.content == BODY and client.retries == 1
            assert srv.connections == 2 and [h.split(b" ")[1] for h in srv.heads] == [
                b"/health",
                b"/metrics",
                b"/metrics",
            ]

    asyncio.run(main())


def test_a_fresh_connection_closed_unanswered_is_not_retried():
    async def main() -> None:
        async with Server(lambda path, n: (b"", "close")) as srv, fastget.Client(srv.url) as client:
            with pytest.raises(fastget.ReadError, match="without an answer"):
                await client.get("/health")
            assert len(srv.heads) == 1 and client.retries == 0

    asyncio.run(main())


def test_a_request_that_got_part_of_an_answer_is_never_sent_again():
    async def main() -> None:
        partial = _ok()[:-10]
        script = lambda path, n: (_ok(), None) if n == 0 else (partial, "close")  # noqa: E731
        async with Server(script) as srv, fastget.Client(srv.url) as client:
            await client.get("/health")
            with pytest.raises(fastget.ReadError, match="mid-answer"):
                await client.get("/metrics")
            assert len(srv.heads) == 2 and client.retries == 0

    asyncio.run(main())


def test_a_timeout_closes_the_connection_and_the_next_request_opens_another():
    async def main() -> None:
        script = lambda path, n: (_ok(), None) if path == "/health" else (b"", "hang")  # noqa: E731
        async with Server(script) as srv, fastget.Client(srv.url) as client:
            await client.get("/health")
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await client.get("/metrics")
            await _until(lambda: srv.open == 0, what="the timed-out connection closed")
            assert not client.idle  # never kept: its answer could still arrive
            assert (await client.get("/health")).status_code == 200
            assert client.connects == 2

    asyncio.run(main())


def test_a_refused_port_is_a_connect_error():
    async def main() -> None:
        srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        srv.close()
        await srv.wait_closed()
        with pytest.raises(fastget.ConnectError):
            await fastget.Client(url).get("/health")

    asyncio.run(main())


# ---- the scraper on top ------------------------------------------------------------------


def _vllm(path: str, n: int, metrics_extra: bytes = b"") -> tuple[bytes, None]:
    if path == "/metrics":
        return _ok(METRICS.encode(), metrics_extra), None
    return _ok(b""), None


def test_an_answer_the_fast_client_does_not_take_switches_the_endpoint_to_httpx():
    async def main() -> None:
        odd = b"Content-Encoding: x-opsctl-test\r\n"  # httpx passes an unknown coding through
        async with (
            Server(lambda path, n: _vllm(path, n, odd)) as srv,
            scrape.Poller(srv.url, None, 5.0) as poller,
        ):
            assert poller.fast is not None
            s = await poller.scrape()
            assert poller.fast is None and poller.slow is not None
            assert s.health.status == 200 and s.samples is not None
            assert s.samples.vllm_series > 300

    asyncio.run(main())


def test_fast_and_httpx_scrapes_read_the_same():
    async def main() -> None:
        async with Server(_vllm) as srv:
            out = []
            for fast in (True, False):
                async with scrape.Poller(srv.url, None, 5.0, fast=fast) as poller:
                    assert (poller.fast is not None) is fast
                    out.append(await poller.scrape())
            a, b = out
            assert (a.health.status, a.metrics.status) == (b.health.status, b.metrics.status)
            assert a.samples == b.samples and a.samples is not None

    asyncio.run(main())


def test_health_answered_then_metrics_quiet_keeps_the_health_answer():
    """/health and /metrics share one deadline; what answered before it is kept (the
    status command's exit 4: a server that answered, then went quiet)."""

    async def main() -> None:
        script = lambda path, n: _vllm(path, n) if path == "/health" else (b"", "hang")  # noqa: E731
        async with Server(script) as srv, scrape.Poller(srv.url, None, 0.5) as poller:
            s = await poller.scrape()
        assert s.health.status == 200 and s.metrics.status is None
        assert s.metrics.error == "timed out after 0.5 s" and s.samples is None

    asyncio.run(main())
