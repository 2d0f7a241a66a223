"""Stand-ins for certify over a fleet: a server that never answers, one behind an API key.

Stand-ins for certify over a fleet (tests/cli/test_certify_fleet_cli.py, the e2e and
benchmarks/certify_fleet.py):

- :func:`hung_server`: accepts every connection and never answers (a wedged server: the
  kernel and the accept loop work, the HTTP answer never comes);
- :func:`keyed_server`: the generative stand-in of tests/standins/completions.py behind
  vLLM's ``--api-key`` rule (/v1/... answers 401 without ``Authorization: Bearer KEY``;
  /health, /version and /metrics stay open), so certify passes with the key and fails
  liveness ("authentication required") without it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from tests.standins.base import serving
from tests.standins.completions import Behaviour, handler_for

KEY = "fleet-s3cret"


@contextlib.contextmanager
def hung_server() -> Iterator[str]:
    """Accepts and holds every connection open without a byte of answer."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:  # the accept timeout, or the socket closed
                continue
            held.append(conn)

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        th.join(5)
        for conn in held:
            conn.close()
        srv.close()


@contextlib.contextmanager
def keyed_server(key: str = KEY) -> Iterator[str]:
    """The generative stand-in started with ``--api-key key``."""

    class Keyed(handler_for(Behaviour())):  # type: ignore[misc]
        API_KEY = key

    with serving(Keyed) as url:
        yield url


@contextlib.contextmanager
def slow_server(delay: float) -> Iterator[str]:
    """The generative stand-in answering every request ``delay`` seconds late.

    Each answer comes within an HTTP timeout above ``delay``; the certification as a
    whole takes longer (first contact alone is two answers).
    """

    class Slow(handler_for(Behaviour())):  # type: ignore[misc]
        DELAY = delay

    with serving(Slow) as url:
        yield url
