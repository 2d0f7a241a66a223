"""The tee proxy's records: requests in flight and finished, behind a lock.

A request in flight is a mutable :class:`_Live` that the loop thread of the proxy
(opsctl.console.tee) writes; :class:`RequestLog` keeps them and the
finished ones (frozen :class:`~opsctl.console.judge_requests.RequestRecord`, the newest RECENT)
behind a lock, and gives the console a frozen :class:`~opsctl.console.judge_requests.RequestsView`."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from opsctl.console import judge_requests as rq

RECENT = 200  # finished requests kept


@dataclass(frozen=True, slots=True)
class TeeSpec:
    """Where the tee listens and the server it relays to."""

    host: str
    port: int
    upstream: str  # normalised base URL

    @property
    def listen_url(self) -> str:
        """The URL clients use to reach the tee."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(slots=True)
class _Live:
    """A request in flight (mutable; the proxy's loop thread writes it)."""

    id: int
    method: str
    shape: rq.RequestShape
    adapter: str | None
    started_at: float
    t0: float  # monotonic
    ttft_s: float | None = None
    status: int | str | None = None
    tokens: tuple[int | None, int | None, str | None] = (None, None, None)
    error: str | None = None
    counter: rq.StreamCounter | None = None
    body: bytearray = field(default_factory=bytearray)

    def freeze(self, now: float, done: bool, duration: float | None = None) -> rq.RequestRecord:
        prompt, output, how = self.tokens
        if not done and self.counter is not None:
            prompt, output, how = self.counter.tokens()
        s = self.shape
        return rq.RequestRecord(
            self.id, self.method, s.endpoint, s.kind, s.model, self.adapter, s.stream,
            self.started_at, self.status if done else None, self.ttft_s,
            duration if duration is not None else now - self.t0, prompt, output, how,
            not done, self.error, s.prompt,
        )  # fmt: skip


class RequestLog:
    """The tee's records, thread-safe: the loop thread writes, the console reads."""

    def __init__(self, spec: TeeSpec, keep_prompts: bool) -> None:
        self.spec = spec
        self.keep_prompts = keep_prompts
        self.lock = threading.Lock()
        self.live: dict[int, _Live] = {}
        self.recent: deque[rq.RequestRecord] = deque(maxlen=RECENT)
        self.seen = self.errors = self.disconnected = 0
        self._next = 0

    def begin(self, method: str, shape: rq.RequestShape, adapter: str | None) -> _Live:
        """Record a request that starts; return its live record."""
        with self.lock:
            self._next += 1
            self.seen += 1
            rec = _Live(self._next, method, shape, adapter, time.time(), time.monotonic())
            self.live[rec.id] = rec
            return rec

    def end(self, rec: _Live) -> None:
        """Move a finished request to the recent ones and count its outcome."""
        now = time.monotonic()
        with self.lock:
            self.live.pop(rec.id, None)
            frozen = rec.freeze(now, True, now - rec.t0)
            self.recent.appendleft(frozen)
            if rec.status == rq.DISCONNECTED:
                self.disconnected += 1
            elif rec.status == rq.UPSTREAM_ERROR or (
                isinstance(rec.status, int) and rec.status >= 400
            ):
                self.errors += 1

    def view(self) -> rq.RequestsView:
        """The requests live and recent, and the counts, frozen for the console."""
        now = time.monotonic()
        with self.lock:
            live = tuple(r.freeze(now, False) for r in sorted(self.live.values(), key=_id))
            return rq.RequestsView(
                self.spec.listen_url, self.spec.upstream, self.keep_prompts, live,
                tuple(self.recent), self.seen, self.errors, self.disconnected,
            )  # fmt: skip


def _id(r: _Live) -> int:
    return r.id
