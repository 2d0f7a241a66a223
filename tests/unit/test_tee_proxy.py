"""The tee proxy's relaying against a stand-in HTTP server (no vLLM: the real-engine
proof is tests/e2e/test_tee_e2e.py): a stream reaches the client chunk by chunk while the
server still holds the rest (never buffered), a client that goes away closes the
upstream connection (also one that resets: disconnected, not a success; one holding its
stream stays in flight), a closed upstream is 502 and ``upstream_error``, a port in use is
BadInput, keep-alive serves several requests on one connection, polling is not recorded."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading

import httpx
import pytest

from opsctl.console import judge_requests as rq
from opsctl.console.tee import TeeProxy, parse_tee
from opsctl.engine.server import free_port
from opsctl.errors import BadInput
from tests.standins.base import StandInVllm, serving
from tests.waiting import wait_until


class Upstream(StandInVllm):
    """/v1/completions: JSON with usage, or (stream) a first chunk, then the rest once
    ``release`` is set; a write that fails is recorded in ``gone``."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()
    gone = threading.Event()
    seen: list[str] = []

    def refused(self) -> bool:
        """Record every request's path; refuse none."""
        self.seen.append(self.path)
        return False

    def models(self) -> list[dict]:
        """A base model and one LoRA adapter on it."""
        return [{"id": "base", "parent": None}, {"id": "ad", "parent": "base"}]

    def metrics_text(self) -> str:
        """A body the test recognises."""
        return "ok"

    def post(self, path: str, body: dict) -> bool:
        """Answer a completion at once, or stream it in two parts around ``release``."""
        if not body.get("stream"):
            usage = {"prompt_tokens": 3, "completion_tokens": 2}
            self._send(200, {"choices": [{"text": "hi"}], "usage": usage})
            return True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        self.wfile.flush()
        self.release.wait(30)
        try:
            for _ in range(50):  # a closed peer fails a write within a few
                self.wfile.write(b'data: {"choices": [{"text": "b"}]}\n\n')
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            self.gone.set()
        return True


@pytest.fixture
def upstream():
    class U(Upstream):
        release = threading.Event()
        gone = threading.Event()
        seen: list[str] = []

    with serving(U) as url:
        yield url, U


@pytest.fixture
def tee(upstream):
    url, _ = upstream
    proxy = TeeProxy(parse_tee(f"127.0.0.1:{free_port()}={url}"))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


@contextlib.contextmanager
def streamed(tee):
    """A streaming completion through ``tee``, open while the block runs."""
    body = {"model": "base", "prompt": "x", "stream": True}
    with (
        httpx.Client(timeout=10) as c,
        c.stream("POST", tee.spec.listen_url + "/v1/completions", json=body) as r,
    ):
        yield r


def test_json_request_relayed_and_recorded_with_usage_and_adapter(tee, upstream):
    _, u = upstream
    with httpx.Client(base_url=tee.spec.listen_url, timeout=10) as c:
        r = c.post("/v1/completions", json={"model": "ad", "prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hi"
        assert c.get("/metrics").text == "ok"  # same connection (keep-alive), not recorded
        r2 = c.post("/v1/completions", json={"model": "base", "prompt": "x"})
        assert r2.status_code == 200
        body = {"model": "base", "prompt": "x", "stream": True}
        u.release.set()
        with c.stream("POST", "/v1/completions", json=body) as s:
            assert [x for x in s.iter_lines() if x][-1] == "data: [DONE]"
        r3 = c.post("/v1/completions", json={"model": "base", "prompt": "y"})
        assert r3.status_code == 200
    # one connection: the client's next request, sent the moment a response ended, was
    # read (not lost to the watch on the client's side); the stream's server closed its
    # connection, the tee kept the client's
    assert tee.connections == 1
    v = wait_until(lambda: (x := tee.view()).seen == 4 and not x.in_flight and x, 10)
    _, _, second, first = v.recent
    assert (first.status, first.prompt_tokens, first.output_tokens, first.tokens_from) == (
        200, 3, 2, rq.FROM_USAGE,
    )  # fmt: skip
    assert first.adapter == "ad" and second.adapter is None and first.prompt is None
    assert first.ttft_s is not None and first.duration_s is not None
    assert "/metrics" in u.seen


def test_stream_is_passed_through_unbuffered_then_completed(tee, upstream):
    _, u = upstream
    with streamed(tee) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")  # arrives while the server holds the rest
        live = tee.view()
        assert len(live.in_flight) == 1 and live.in_flight[0].output_tokens == 1
        assert live.in_flight[0].status is None
        u.release.set()
        rest = [x for x in lines if x]
    assert rest[-1] == "data: [DONE]"
    v = wait_until(lambda: (x := tee.view()).recent and x, 10)
    rec = v.recent[0]
    assert (rec.status, rec.output_tokens, rec.tokens_from) == (200, 51, rq.FROM_CHUNKS)
    assert rec.stream and not rec.in_flight


def test_client_gone_mid_stream_closes_the_upstream(tee, upstream):
    _, u = upstream
    with streamed(tee) as r:
        assert next(r.iter_lines()).startswith("data:")
    # the client closed; the tee notices it while the server is silent
    v = wait_until(lambda: (x := tee.view()).recent and x, 10, "the record of the request")
    assert v.recent[0].status == rq.DISCONNECTED and v.disconnected == 1
    u.release.set()
    wait_until(u.gone.is_set, 10, "the server's writes to fail (upstream closed)")


def stream_request(port: int) -> socket.socket:
    """A raw client that sent a streaming completion and read the first event."""
    body = json.dumps({"model": "base", "prompt": "x", "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: tee\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    got = b""
    while b"data:" not in got:
        got += s.recv(16)  # a few bytes at a time: some of the response stays unread
    return s


def test_client_reset_mid_stream_is_disconnected_not_a_success(tee, upstream):
    # a client that closes with bytes of the response still unread (the usual way a
    # streaming client stops and leaves: httpx closes a half-read stream's connection)
    # makes its kernel send a reset, not an EOF: the tee's read on the client's
    # connection fails. It was recorded as status 200 (the response's), a success.
    _, u = upstream
    s = stream_request(tee.spec.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # linger 0: a reset, whatever is unread
    v = wait_until(lambda: (x := tee.view()).recent and x, 10, "the record of the request")
    assert v.recent[0].status == rq.DISCONNECTED and v.disconnected == 1, v.recent
    assert v.recent[0].output_tokens == 1  # the first chunk, counted before it left
    u.release.set()
    wait_until(u.gone.is_set, 10, "the server's writes to fail (upstream closed)")


def test_a_client_holding_a_stream_is_not_gone_until_it_closes(tee, upstream):
    # the e2e's former false "disconnected": its client dropped the iter_lines()
    # generator after one line; CPython finalised it at once and httpcore closed the
    # connection (GeneratorExit in its body iterator). The tee saw a real close. A
    # client that keeps the stream open stays in flight, however slowly it reads.
    body = {"model": "base", "prompt": "x", "stream": True}
    with (
        httpx.Client(timeout=10) as c,
        c.stream("POST", tee.spec.listen_url + "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
        held = tee.view()
        assert len(held.in_flight) == 1 and not held.recent
        # the same client, its line iterator dropped: httpcore closes the connection
        c2 = httpx.Client(timeout=10)
        with c2.stream("POST", tee.spec.listen_url + "/v1/completions", json=body) as r2:
            assert next(r2.iter_lines()).startswith("data:")
            gone = wait_until(lambda: (x := tee.view()).recent and x, 10, "a record")
            assert gone.recent[0].status == rq.DISCONNECTED, gone.recent
        c2.close()
        assert len(tee.view().in_flight) == 1  # the first client's stream: still live


def test_upstream_down_is_502_and_upstream_error():
    proxy = TeeProxy(parse_tee(f"127.0.0.1:{free_port()}=http://127.0.0.1:{free_port()}"))
    proxy.start()
    try:
        r = httpx.post(proxy.spec.listen_url + "/v1/completions", json={"model": "m"}, timeout=10)
        assert r.status_code == 502 and "opsctl tee" in r.text
        v = wait_until(lambda: (x := proxy.view()).recent and x, 10)
        assert v.recent[0].status == rq.UPSTREAM_ERROR and v.errors == 1
        assert "ConnectError" in (v.recent[0].error or "")
    finally:
        proxy.close()


def test_port_in_use_is_bad_input():
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proxy = TeeProxy(parse_tee(f"127.0.0.1:{port}=http://127.0.0.1:1"))
        with pytest.raises(BadInput) as exc:
            proxy.bind()
        assert "address already in use" in str(exc.value)
        proxy.close()


def test_kept_prompts_only_when_asked(upstream):
    url, _ = upstream
    proxy = TeeProxy(parse_tee(f"127.0.0.1:{free_port()}={url}"), keep_prompts=True)
    proxy.start()
    try:
        httpx.post(proxy.spec.listen_url + "/v1/completions",
                   json={"model": "base", "prompt": "remember me"}, timeout=10)  # fmt: skip
        v = wait_until(lambda: (x := proxy.view()).recent and x, 10)
        assert v.recent[0].prompt == "remember me" and v.keep_prompts
    finally:
        proxy.close()


@pytest.mark.parametrize("case", ["port in use", "bad url", "not loopback", "no ="])
def test_cli_bad_tee_is_one_line_exit_2(case):
    import subprocess
    import sys

    with contextlib.closing(socket.socket()) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        spec = {
            "port in use": f"127.0.0.1:{port}=http://127.0.0.1:1",
            "bad url": f"127.0.0.1:{free_port()}=ftp://nowhere",
            "not loopback": f"0.0.0.0:{free_port()}=http://127.0.0.1:1",
            "no =": "127.0.0.1:8100",
        }[case]
        r = subprocess.run(
            [sys.executable, "-m", "opsctl", "console", "--once", "--json", "--no-discover",
             "--tee", spec],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("opsctl: error:")]
    assert len(errors) == 1 and "--tee" in errors[0] and "Traceback" not in r.stderr
    assert r.stdout == ""
