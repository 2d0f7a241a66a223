"""``opsctl console --tee LISTEN=URL``: a recording reverse proxy before one server.

The console shows the server's live requests from what passes.

Clients talk to LISTEN (loopback: the CLI refuses another address; the library's
``parse_tee(any_address=True)`` allows one); every request is relayed
to URL as it is, and the response back as it arrives: bytes are written to the client
chunk by chunk (a stream is never buffered). While the bytes pass, a
:class:`~opsctl.console.judge_requests.StreamCounter` reads the SSE events (time to first
content, chunks, the final usage chunk); a JSON response's ``usage`` is read at its end.
A client that goes away mid-response is noticed by a read on its connection that
returns EOF or fails (a client that closes with bytes still unread sends a reset, not
an EOF), also while the server is still silent (prefill), or by a write to it that
fails: the record says ``disconnected`` and the upstream response is closed at once,
which makes vLLM abort the request (its running count drops).

The proxy runs its own asyncio loop on a daemon thread (asyncio streams + h11 for
HTTP/1.1, httpx to the server), so neither the console's scrape loop nor the TUI can
slow it. :class:`TeedSource` wraps a FleetSource: every view of the tee's server carries
the tee's :class:`~opsctl.console.judge_requests.RequestsView`."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import replace

import h11
import httpx

from opsctl.console import judge_requests as rq
from opsctl.console.judge import FleetSnapshot
from opsctl.console.source import FleetSource, WrappedSource
from opsctl.console.tee_records import RequestLog, TeeSpec, _Live
from opsctl.errors import BadInput

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 64 << 20  # a request body above this is refused (413)
MODELS_EVERY_S = 10.0  # /v1/models re-read at most this often (a new adapter name)
# hop-by-hop headers (RFC 9110 7.6.1) and the ones h11/httpx set themselves
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)


def parse_tee(spec: str, any_address: bool = False) -> TeeSpec:
    """The TeeSpec of ``LISTEN=URL``; BadInput when malformed or not loopback.

    LISTEN is HOST:PORT or PORT (127.0.0.1); one beyond loopback needs ``any_address``."""
    from opsctl.console.targets import normalise_url

    listen, sep, url = spec.partition("=")
    if not sep or not listen.strip() or not url.strip():
        raise BadInput(
            f"--tee wants LISTEN=URL, got {spec!r}",
            hint="e.g. --tee 127.0.0.1:8100=http://127.0.0.1:8000",
        )
    listen = listen.strip()
    if listen.startswith("["):
        host, _, port_s = listen[1:].partition("]")
        port_s = port_s.removeprefix(":")
    elif ":" in listen:
        host, _, port_s = listen.rpartition(":")
    else:
        host, port_s = "127.0.0.1", listen
    try:
        port = int(port_s)
    except ValueError:
        raise BadInput(f"--tee: {listen!r} has no valid port") from None
    if not 0 < port < 65536:
        raise BadInput(f"--tee: port {port} is out of range (1-65535)")
    if host == "localhost":
        host = "127.0.0.1"
    if not any_address and host not in LOOPBACK:
        raise BadInput(
            f"--tee listens on 127.0.0.1 only, got {host!r}",
            hint="the tee relays the server's whole API: it listens on loopback only",
        )
    try:
        upstream = normalise_url(url.strip())
    except BadInput as exc:
        raise BadInput(f"--tee: {exc.message}", exc.hint) from None
    return TeeSpec(host, port, upstream)


# ---- the proxy --------------------------------------------------------------------------


class TeeProxy:
    """The recording reverse proxy: bind, start its loop thread, close.

    Bind with :meth:`bind` (errors are BadInput, before anything else starts), then
    :meth:`start` the loop thread; :meth:`close` stops it and cancels what is in flight."""

    def __init__(self, spec: TeeSpec, *, keep_prompts: bool = False) -> None:
        self.spec = spec
        self.log = RequestLog(spec, keep_prompts)
        self.sock: socket.socket | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._thread, name="console-tee", daemon=True)
        self.served: dict[str, str | None] = {}
        self._models_at = -MODELS_EVERY_S
        self._server: asyncio.base_events.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task] = set()
        self.connections = 0  # client connections accepted (keep-alive serves many on one)

    def bind(self) -> None:
        """Bind the listening socket (BadInput when the address is unusable)."""
        family = socket.AF_INET6 if ":" in self.spec.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.spec.host, self.spec.port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            why = "address already in use" if exc.errno == 98 else (exc.strerror or str(exc))
            raise BadInput(
                f"--tee cannot listen on {self.spec.host}:{self.spec.port}: {why}"
            ) from None
        sock.setblocking(False)
        self.sock = sock

    def start(self) -> None:
        """Start the proxy's loop thread and begin serving (binding first if needed)."""
        if self.sock is None:
            self.bind()
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        fut.result(timeout=10)

    def _thread(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _start(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0), limits=httpx.Limits(max_connections=None)
        )
        self._server = await asyncio.start_server(self._connection, sock=self.sock)

    def close(self) -> None:
        """Stop serving, cancel what is in flight and join the thread."""
        if not self.thread.is_alive():
            if self.sock is not None:
                self.sock.close()
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._client is not None:
            await self._client.aclose()

    def view(self) -> rq.RequestsView:
        """The requests seen so far, frozen for the console."""
        return self.log.view()

    # ---- one client connection ---------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        try:
            while True:
                got = await self._read_request(conn, reader, writer)
                if got is None:
                    break
                if not await self._relay(conn, reader, writer, *got):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(self, conn: h11.Connection, reader, writer):
        req: h11.Request | None = None
        body = bytearray()
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and req is None:
                    return None
                continue
            if isinstance(ev, h11.Request):
                req = ev
            elif isinstance(ev, h11.Data):
                body += ev.data
                if len(body) > MAX_BODY:
                    await self._simple(conn, writer, 413, b"request body too large\n")
                    return None
            elif isinstance(ev, h11.EndOfMessage):
                assert req is not None
                return req, bytes(body)
            elif isinstance(ev, h11.ConnectionClosed):
                return None

    async def _simple(self, conn: h11.Connection, writer, status: int, text: bytes) -> None:
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError):
            headers = [("content-type", "text/plain"), ("content-length", str(len(text)))]
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
            writer.write(conn.send(h11.Data(data=text)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()

    async def _adapter(self, model: str | None) -> str | None:
        if model is None:
            return None
        now = time.monotonic()
        if model not in self.served and now - self._models_at >= MODELS_EVERY_S:
            self._models_at = now
            assert self._client is not None
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await self._client.get(self.spec.upstream + "/v1/models", timeout=5.0)
                self.served = rq.served_models(r.json())
        return rq.adapter_for(model, self.served)

    async def _relay(self, conn: h11.Connection, reader, writer, req: h11.Request, body: bytes):
        """Relay one request; True when the connection may serve another."""
        method = req.method.decode()
        target = req.target.decode()
        rec = None
        if rq.recorded(target):
            shape = rq.parse_request(target, body, self.log.keep_prompts)
            rec = self.log.begin(method, shape, await self._adapter(shape.model))
            if shape.stream:
                rec.counter = rq.StreamCounter()
        headers = [(k.decode(), v.decode("latin-1")) for k, v in req.headers]
        fwd = [(k, v) for k, v in headers if k.lower() not in _HOP]
        fwd.append(("accept-encoding", "identity"))
        assert self._client is not None
        up_req = self._client.build_request(
            method, self.spec.upstream + target, headers=fwd, content=body
        )
        try:
            up = await self._client.send(up_req, stream=True)
        except httpx.HTTPError as exc:
            if rec is not None:
                rec.status, rec.error = rq.UPSTREAM_ERROR, _why(exc)
                self.log.end(rec)
            await self._simple(conn, writer, 502, f"opsctl tee: {_why(exc)}\n".encode())
            return False
        try:
            return await self._respond(conn, reader, writer, up, rec)
        finally:
            await up.aclose()  # a disconnect: closes the upstream connection (vLLM aborts)
            if rec is not None:
                self.log.end(rec)

    async def _respond(self, conn, reader, writer, up: httpx.Response, rec: _Live | None):
        out = [(k, v) for k, v in up.headers.multi_items() if k.lower() not in _HOP]
        if "content-length" in up.headers and "transfer-encoding" not in up.headers:
            out.append(("content-length", up.headers["content-length"]))
        try:
            writer.write(conn.send(h11.Response(status_code=up.status_code, headers=out)))
            await writer.drain()
        except OSError:
            _disconnected(rec)
            return False
        if rec is not None:
            rec.status = up.status_code
        gone = asyncio.ensure_future(reader.read(65536))  # b"" or a reset: the client left
        chunks = up.aiter_raw().__aiter__()
        try:
            while True:
                nxt = asyncio.ensure_future(chunks.__anext__())
                await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done() and not nxt.done():
                    data = _client_read(gone)
                    if not data:
                        nxt.cancel()
                        with contextlib.suppress(BaseException):
                            await nxt
                        _disconnected(rec)
                        return False
                    conn.receive_data(data)  # pipelined: h11 keeps it for the next cycle
                    gone = asyncio.ensure_future(reader.read(65536))
                try:
                    chunk = await nxt
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as exc:
                    if rec is not None:
                        rec.error = f"server broke off: {_why(exc)}"
                    return False
                self._saw(rec, chunk)
                try:
                    writer.write(conn.send(h11.Data(data=chunk)))
                    await writer.drain()
                except OSError:  # a reset or broken pipe: the client left
                    _disconnected(rec)
                    return False
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        finally:
            await _settle(gone, conn)
        if rec is not None:
            self._finish(rec)
        return True

    def _saw(self, rec: _Live | None, chunk: bytes) -> None:
        if rec is None or not chunk:
            return
        now = time.monotonic()
        if rec.counter is not None:
            rec.counter.feed(chunk, now)
            if rec.ttft_s is None and rec.counter.first_content_at is not None:
                rec.ttft_s = rec.counter.first_content_at - rec.t0
            return
        if rec.ttft_s is None:
            rec.ttft_s = now - rec.t0  # a JSON answer: its first byte
        if len(rec.body) < 4 * MAX_BODY:
            rec.body += chunk

    def _finish(self, rec: _Live) -> None:
        if rec.counter is not None:
            rec.tokens = rec.counter.tokens()
            return
        usage = rq.body_usage(bytes(rec.body))
        rec.body = bytearray()
        if usage is not None:
            rec.tokens = (usage[0], usage[1], rq.FROM_USAGE)


async def _settle(gone: asyncio.Future, conn: h11.Connection) -> None:
    """End the watch on the client's connection. What it read is the client's next
    request (keep-alive: it may send it the moment our response ended) or its EOF:
    handed to h11, never lost; the cancelled read is awaited so the next read() on the
    stream does not find it still waiting."""
    if not gone.done():
        gone.cancel()
    try:
        data = await gone
    except (asyncio.CancelledError, OSError):
        return
    conn.receive_data(data)


def _client_read(read: asyncio.Future) -> bytes:
    """What a finished read of the client's connection got; b"" when the client left:
    an EOF, or a read that failed (ECONNRESET: a client that closes with bytes of our
    response still unread sends a reset, not an EOF; this is the common way a streaming
    client stops reading and goes away)."""
    try:
        return read.result()
    except OSError:
        return b""


def _disconnected(rec: _Live | None) -> None:
    if rec is not None:
        rec.status = rq.DISCONNECTED
        if rec.counter is not None:
            rec.tokens = rec.counter.tokens()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# ---- the console side -------------------------------------------------------------------


class TeedSource(WrappedSource):
    """A FleetSource whose views of the tee's server carry its requests.

    They go in ``EndpointView.requests``; everything else is the wrapped source's
    (WrappedSource)."""

    def __init__(self, source: FleetSource, proxy: TeeProxy) -> None:
        from opsctl.console.targets import endpoint_key

        super().__init__(source)
        self.proxy = proxy
        self._key = endpoint_key(proxy.spec.upstream)
        self._keys: dict[str, bool] = {}  # url -> is the tee's server

    def start(self) -> None:
        """Start the proxy, then the wrapped source."""
        self.proxy.start()
        self.source.start()

    def close(self) -> None:
        """Close the wrapped source, then the proxy."""
        try:
            self.source.close()
        finally:
            self.proxy.close()

    def collect(self) -> FleetSnapshot:
        """The wrapped source's snapshot; the tee's server's view with its requests."""
        from opsctl.console.targets import endpoint_key

        snap = self.source.collect()
        view = self.proxy.view()
        keys = self._keys
        for v in snap.endpoints:
            if v.target.url not in keys:
                keys[v.target.url] = endpoint_key(v.target.url) == self._key
        views = tuple(
            replace(v, requests=view) if keys[v.target.url] else v for v in snap.endpoints
        )
        return replace(snap, endpoints=views)
