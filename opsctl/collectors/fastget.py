"""A minimal keep-alive HTTP/1.1 GET client for the console's hot paths.

/health and /metrics of every endpoint, every interval, on an asyncio Protocol.

Why not httpx here: one httpx GET costs about 1.5-1.8 ms of CPU on this project's hosts
(request and URL objects, header merging, httpcore's pool, h11's state machine, anyio,
response objects): at 256 endpoints x 2 requests a second that alone is most of a core.
This client does what those two requests need and nothing else: one prebuilt request
per path (bytes), one connection per endpoint kept between polls, the answer framed by
Content-Length, chunked encoding or the connection's close (docs/console_perf.md has
the figures).

What it does not do goes through httpx (``usable()`` says False, or ``Unsupported`` is
raised and the caller switches the endpoint over): https, proxies (the environment's
``http_proxy``/``all_proxy`` for this host), user:password in the URL, queries,
redirects are not followed (httpx does not follow them either: a 3xx is an answer),
transfer or content encodings other than chunked / gzip / deflate, 101 upgrades.

Connections: an idle connection is used again only while it is younger than
``IDLE_S`` since its last answer (vLLM/uvicorn closes one idle for 5 s) and the server
has not closed it. A request sent on a reused connection that the server closed before
answering anything (the close raced the send) is sent once more on a fresh connection;
a request that got any part of an answer is never repeated. A timeout is the caller's
(``asyncio.timeout`` around the poll): a request cancelled mid-way closes its connection.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import zlib
from urllib.parse import urlsplit

IDLE_S = 4.0  # below uvicorn's 5 s keep-alive; a close racing a send is retried once
MAX_IDLE = 2  # connections kept per endpoint (one poll uses one; info fetches a few)
MAX_HEAD = 64 * 1024
USER_AGENT = "opsctl"
_HEX = b"0123456789abcdefABCDEF"


class HTTPError(Exception):
    """A request that got no usable answer (the name of the subclass says why)."""


class ConnectError(HTTPError):
    """No connection to the server could be made."""

    pass


class ReadError(HTTPError):
    """The connection failed while reading the answer."""

    pass


class RemoteProtocolError(HTTPError):
    """The server's answer broke HTTP/1.1."""

    pass


class Unsupported(Exception):
    """An answer (or URL) this client does not handle: use httpx for this endpoint."""


class _Unanswered(ReadError):
    """The connection closed before any byte of the answer arrived."""


class Response:
    """What the scraper reads of an answer (the names httpx.Response has)."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")

    def json(self):
        """The body parsed as JSON."""
        import json

        return json.loads(self.content)


def usable(url: str) -> bool:
    """This client can GET from ``url`` (a base URL: scheme, host, port, maybe a path)."""
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return False
    if u.scheme != "http" or not u.hostname or u.username or u.password:
        return False
    if u.query or u.fragment:
        return False
    proxies = urllib.request.getproxies_environment()
    if proxies.get("http") or proxies.get("all"):
        return bool(urllib.request.proxy_bypass_environment(u.hostname, proxies))
    return True


class _Conn(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.waiter: asyncio.Future | None = None
        self.buf = bytearray()
        self.got = False  # any byte of the current answer
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body_at = -1  # offset of the body in buf once the head is read
        self.length: int | None = None  # Content-Length
        self.chunked = False
        self.chunk_at = 0  # chunked: offset of the next chunk-size line
        self.body = bytearray()  # chunked: the body so far
        self.keep = True  # reusable after this answer

    # ---- asyncio callbacks ------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():  # nothing asked: not HTTP as we know it
            self._close()
            return
        self.got = True
        self.buf += data
        try:
            self._advance()
        except (HTTPError, Unsupported) as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.body_at >= 0 and self.length is None and not self.chunked:
                try:  # the close ends the body
                    self._finish(bytes(self.buf[self.body_at :]))
                except HTTPError as exc:
                    self._fail(exc)
            else:
                self._fail(self._closed_error())
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self._fail(self._closed_error(exc))

    # ---- the request --------------------------------------------------------------------
    async def request(self, req: bytes) -> Response:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.buf.clear()
        self.got, self.status, self.body_at, self.length = False, 0, -1, None
        self.chunked, self.chunk_at, self.keep, self.body = False, 0, True, bytearray()
        self.transport.write(req)
        try:
            return await self.waiter
        except BaseException:  # cancelled (the caller's timeout) or failed: not reusable
            self._close()
            raise
        finally:
            self.waiter = None

    def _closed_error(self, exc: Exception | None = None) -> HTTPError:
        why = f": {exc}" if exc else ""
        if not self.got:
            return _Unanswered(f"the server closed the connection without an answer{why}")
        return ReadError(f"the server closed the connection mid-answer{why}")

    def _fail(self, exc: BaseException) -> None:
        self._close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _finish(self, content: bytes) -> None:
        enc = self.headers.get("content-encoding", "identity").lower()
        if enc != "identity":
            content = _decode(enc, content)
        if not self.keep or self.closed:
            self._close()
        else:
            self.idle_since = time.monotonic()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Response(self.status, self.headers, content))

    # ---- framing -------------------------------------------------------------------------
    def _advance(self) -> None:
        buf = self.buf
        if self.body_at < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    raise RemoteProtocolError("answer head over 64 KiB")
                return
            self._head(bytes(buf[:end]).decode("latin-1"))
            if 100 <= self.status < 200:  # 100 Continue and friends: the answer follows
                if self.status == 101:
                    raise Unsupported("101 Switching Protocols")
                del buf[: end + 4]
                self.body_at, self.length, self.chunked = -1, None, False
                self._advance()
                return
            self.body_at = end + 4
            self.chunk_at = self.body_at
        if self.chunked:
            self._chunks()
        elif self.length is not None:
            have = len(buf) - self.body_at
            if have >= self.length:
                if have > self.length:  # more than the answer: nothing to trust after it
                    self.keep = False
                self._finish(bytes(buf[self.body_at : self.body_at + self.length]))

    def _head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t":
                raise RemoteProtocolError(f"bad header line: {line[:80]!r}")
            name, value = name.lower(), value.strip()
            if name in headers:  # a repeated header: a list, as HTTP folds them
                if name == "content-length" and headers[name] != value:
                    raise RemoteProtocolError("conflicting Content-Length")
                value = headers[name] if name == "content-length" else f"{headers[name]}, {value}"
            headers[name] = value
        self.headers = headers
        conn = headers.get("connection", "").lower()
        if "close" in conn or (parts[0] == "HTTP/1.0" and "keep-alive" not in conn):
            self.keep = False
        te = headers.get("transfer-encoding")
        if self.status in (204, 304) or self.status < 200:  # no body, whatever it says
            self.length = 0
        elif te is not None:
            if te.strip().lower() != "chunked":
                raise Unsupported(f"Transfer-Encoding: {te}")
            self.chunked = True
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not (cl.isascii() and cl.isdigit()):
                raise RemoteProtocolError(f"bad Content-Length: {cl[:40]!r}")
            self.length = int(cl)
        else:
            self.keep = False  # the body ends when the server closes
        enc = headers.get("content-encoding", "identity").lower()
        if enc not in ("identity", "gzip", "deflate"):
            raise Unsupported(f"Content-Encoding: {enc}")

    def _chunks(self) -> None:
        buf, at = self.buf, self.chunk_at
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                if len(buf) - at > 1024:
                    raise RemoteProtocolError("chunk size line over 1 KiB")
                break
            size_text = bytes(buf[at:eol]).split(b";", 1)[0].strip()
            if not size_text or size_text.strip(_HEX):  # int() would take "-1", "0x1", "1_0"
                raise RemoteProtocolError(f"bad chunk size: {size_text[:40]!r}")
            size = int(size_text, 16)
            if size == 0:  # the last chunk, then trailers (ignored) and an empty line
                if buf[eol + 2 : eol + 4] == b"\r\n":
                    end = eol + 4
                else:
                    t = buf.find(b"\r\n\r\n", eol + 2)
                    if t < 0:
                        break
                    end = t + 4
                if len(buf) > end:
                    self.keep = False
                self.chunk_at = end
                self._finish(bytes(self.body))
                return
            data_end = eol + 2 + size
            if len(buf) < data_end + 2:
                break
            if buf[data_end : data_end + 2] != b"\r\n":
                raise RemoteProtocolError("chunk not followed by CRLF")
            self.body += buf[eol + 2 : data_end]
            at = data_end + 2
        if at > self.body_at:  # drop what was consumed (keeps buf small)
            del buf[self.body_at : at]
        self.chunk_at = self.body_at


def _decode(enc: str, content: bytes) -> bytes:
    try:
        if enc == "gzip":
            return zlib.decompress(content, 16 + zlib.MAX_WBITS)
        try:
            return zlib.decompress(content)
        except zlib.error:  # raw deflate, as some servers send it
            return zlib.decompress(content, -zlib.MAX_WBITS)
    except zlib.error as exc:
        raise RemoteProtocolError(f"bad {enc} body: {exc}") from None


class Client:
    """GETs from one server (``base``) over kept connections.

    ``base`` is http://host:port[/prefix]; ``headers`` are sent with every request (the Bearer
    key)."""

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        if not usable(base):
            raise Unsupported(f"not a plain http URL this client handles: {base}")
        u = urlsplit(base)
        self.host = u.hostname or ""
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {u.netloc}\r\nUser-Agent: {USER_AGENT}\r\nAccept: */*\r\n{extra}\r\n"
        fields = [self.prefix, *(f"{k}{v}" for k, v in (headers or {}).items())]
        if any("\r" in f or "\n" in f for f in fields) or " " in self.prefix:
            raise Unsupported("a URL path or header with a space or line break")
        if not self._head.isascii() or not self.prefix.isascii():
            raise Unsupported("a URL path or header that is not ASCII")
        self._requests: dict[str, bytes] = {}
        self.idle: list[_Conn] = []
        self.connects = 0  # connections opened (tests, benchmarks)
        self.retries = 0  # requests sent again after a close that raced them

    def _request(self, path: str) -> bytes:
        req = self._requests.get(path)
        if req is None:
            req = f"GET {self.prefix}{path} HTTP/1.1\r\n{self._head}".encode("latin-1")
            self._requests[path] = req
        return req

    async def get(self, path: str) -> Response:
        """GET ``path``: on an idle kept connection when there is one, else a new one."""
        req = self._request(path)
        conn = self._take()
        if conn is not None:
            try:
                r = await conn.request(req)
            except _Unanswered:  # closed as we sent: never answered, so safe to send again
                self.retries += 1
            else:
                self._give(conn)
                return r
        conn = await self._connect()
        try:
            r = await conn.request(req)
        except _Unanswered as exc:
            raise ReadError(str(exc)) from None
        self._give(conn)
        return r

    def _take(self) -> _Conn | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_S:
                return conn
            conn._close()
        return None

    def _give(self, conn: _Conn) -> None:
        if conn.closed:
            return
        if len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
        else:
            conn._close()

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from None
        self.connects += 1
        return conn

    async def aclose(self) -> None:
        """Close every idle connection."""
        while self.idle:
            self.idle.pop()._close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
