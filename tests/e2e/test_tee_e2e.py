"""``console --tee`` and ``--log`` on a REAL vLLM engine (the session pool's tiny-llama:
these tests only send requests and read its metrics and log, so they start no engine of
their own).

Through the tee: a JSON completion (tokens from its usage), a chat stream with
``stream_options.include_usage`` (tokens from the final usage chunk), a completion stream
without it (content chunks counted, and said so), each with TTFT and duration, and the
records as the console shows them (the console's direct source wrapped as the command
wraps it: in flight while a long stream runs, then finished; the document's ``tee``
checked against the opsctl.console/4 schema). A client that goes away mid-stream: the
record says ``disconnected`` and the engine stops generating for it (running back to 0,
far fewer tokens generated than the request asked for: the upstream request was
cancelled). And ``opsctl console --once --json --log URL=FILE`` on the engine's own
server.log, which vLLM is writing while the console reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from opsctl.checks.target import EngineSpec
from opsctl.console import judge_requests as rq
from opsctl.domain.metrics import GEN_TOKENS, RUNNING, parse_samples
from opsctl.engine.server import free_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.pool("tiny-llama")]
SCHEMA = Path(__file__).resolve().parents[1] / "data/schemas/opsctl.console-4.schema.json"
LONG = 200  # tokens a request asks for (ignore_eos: it would generate all of them)


@pytest.fixture(scope="module")
def engine(engine_pool):
    from tests.engine_pool import SPECS

    # the pool's standard tiny-llama (its SPECS entry where there is one)
    spec = None if "tiny-llama" in SPECS else EngineSpec("tiny-llama")
    return engine_pool.engine("tiny-llama", spec)


@pytest.fixture(scope="module")
def model(engine) -> str:
    return httpx.get(f"{engine.url}/v1/models", timeout=30).json()["data"][0]["id"]


def figures(url: str) -> tuple[float, float]:
    s = parse_samples(httpx.get(f"{url}/metrics", timeout=30).text)
    return s.get(RUNNING) or 0.0, s.get(GEN_TOKENS) or 0.0


@pytest.fixture
def console(engine):
    """The console's direct source over the engine, with a tee in front of it, wrapped
    exactly as ``opsctl console --tee`` wraps it."""
    from opsctl.console import taps as tp
    from opsctl.console import targets as tg
    from opsctl.console.direct import DirectScrapeSource
    from opsctl.console.judge_state import Settings

    taps = tp.parse(f"127.0.0.1:{free_port()}={engine.url}", None)
    static = tg.from_urls(tp.with_urls([], taps))
    source = tp.wrap(DirectScrapeSource(static, discover=False, settings=Settings(0.5)), taps)
    source.start()
    try:
        yield source, taps.tee
    finally:
        source.close()


def tee_doc(source, snap=None) -> dict:
    """The tee's part of the console's --once document (of ``snap``, a snapshot taken
    earlier, or of one taken now), checked against the schema."""
    import jsonschema

    from opsctl.console.report import document

    doc = document(snap if snap is not None else source.collect())
    tee = doc["endpoints"][0]["tee"]
    schema = json.loads(SCHEMA.read_text())
    sub = {**schema["definitions"]["tee"], "definitions": schema["definitions"]}
    jsonschema.Draft7Validator(sub).validate(tee)
    return tee


def test_requests_through_the_tee(console, model):
    source, tee = console
    base = tee.spec.listen_url
    with httpx.Client(base_url=base, timeout=120) as c:
        # 1. JSON: usage read from the body
        r = c.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 5})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        # 2. chat stream with include_usage
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "do not keep this prompt"}],
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks = []
        with c.stream("POST", "/v1/chat/completions", json=body) as s:
            chunks += [x for x in s.iter_lines() if x]
        assert chunks[-1] == "data: [DONE]"
        final = json.loads(chunks[-2].removeprefix("data: "))
        # 3. completion stream without usage: the content chunks are counted
        body3 = {"model": model, "prompt": "Count", "max_tokens": 7, "ignore_eos": True,
                 "stream": True}  # fmt: skip
        with c.stream("POST", "/v1/completions", json=body3) as s:
            got = [x for x in s.iter_lines() if x.startswith("data: {")]
    texts = [json.loads(x[6:])["choices"][0]["text"] for x in got]
    doc = wait_until(lambda: (d := tee_doc(source))["requests_seen"] == 3
                     and not d["requests_in_flight"] and d, 30, "three finished records")  # fmt: skip
    plain, chat, counted = reversed(doc["requests"])  # newest first
    assert (plain["status"], plain["prompt_tokens"], plain["output_tokens"]) == (
        200, usage["prompt_tokens"], usage["completion_tokens"],
    )  # fmt: skip
    assert plain["tokens_from"] == "usage" and plain["model"] == model and not plain["stream"]
    assert chat["endpoint"] == "/v1/chat/completions" and chat["tokens_from"] == "usage"
    assert chat["output_tokens"] == final["usage"]["completion_tokens"] == 12
    assert chat["prompt_tokens"] == final["usage"]["prompt_tokens"]
    assert chat["prompt"] is None  # never stored unless --tee-keep-prompts
    assert counted["tokens_from"] == "chunks" and counted["prompt_tokens"] is None
    # every output chunk, also those whose text is empty (a token that ends mid-character:
    # tiny-llama has many); vLLM merges steps into one chunk when its API server falls
    # behind (6 chunks for 7 tokens seen here), so the count is a lower bound: "chunks"
    assert counted["output_tokens"] == len(texts), texts
    assert 1 <= counted["output_tokens"] <= 7
    for rec in (plain, chat, counted):
        assert rec["adapter"] is None and rec["status"] == 200
        assert 0 < rec["ttft_s"] <= rec["duration_s"], rec
    assert doc["requests_failed"] == 0 and doc["requests_disconnected"] == 0


def test_client_disconnect_mid_stream_cancels_the_request(console, engine, model):
    source, tee = console
    body = {"model": model, "prompt": "Tell", "max_tokens": LONG, "ignore_eos": True,
            "stream": True}  # fmt: skip
    # tiny-llama generates the LONG tokens (max_model_len 256 caps them) in about a
    # second on an idle core; on busy cores the way from its first token to its abort
    # (relayed, read, the client gone, the tee's upstream close, vLLM's abort) can take
    # longer. An attempt in which vLLM finished first proves nothing about the tee: one
    # more (a tee that never closes the upstream request fails every attempt)
    tries = []
    for attempt in range(1, 4):
        _, gen_before = figures(engine.url)
        with (
            httpx.Client(timeout=120) as c,
            c.stream("POST", tee.spec.listen_url + "/v1/completions", json=body) as s,
        ):
            # the iterator is kept: a dropped one is finalised at once, and httpcore
            # then closes the half-read response's connection (this test's former false
            # "disconnected": its client had left before the console looked)
            lines = s.iter_lines()
            first = next(lines)
            assert first.startswith("data:")
            # in flight on the console's row while vLLM generates: the snapshot taken
            # here, its document made and checked once the client left
            snap = source.collect()
        held = tee_doc(source, snap)
        assert held["requests_in_flight"] == 1, held
        live = held["requests"][0]
        assert live["in_flight"] and live["status"] is None and live["stream"]
        # the client is gone: the tee notices and closes the upstream request
        doc = wait_until(lambda n=attempt: (d := tee_doc(source))["requests_disconnected"] == n
                         and d, 30, "the disconnected record", show=lambda: tee_doc(source))  # fmt: skip
        rec = doc["requests"][0]
        assert rec["status"] == rq.DISCONNECTED and not rec["in_flight"]
        assert rec["output_tokens"] is not None and rec["output_tokens"] >= 1
        wait_until(lambda: figures(engine.url)[0] == 0, 30, "vLLM's running count back to 0",
                   show=lambda: figures(engine.url))  # fmt: skip
        generated = figures(engine.url)[1] - gen_before
        tries.append((generated, rec["ttft_s"], rec["duration_s"]))
        if generated < LONG:
            break  # vLLM aborted it: it did not go on to generate the LONG tokens asked
    # (tokens generated, the record's TTFT and duration) per attempt
    print(f"client disconnect attempts (generated, ttft_s, duration_s): {tries}")
    assert tries[-1][0] < LONG, f"every request ran to its end: {tries}"


def test_console_once_json_tails_the_engines_own_log(engine):
    log = Path(engine.run_dir) / "server.log"
    assert log.stat().st_size > 0
    r = subprocess.run(
        [sys.executable, "-m", "opsctl", "console", "--once", "--json", "--no-discover",
         "--log", f"{engine.url}={log}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    ep = json.loads(r.stdout)["endpoints"][0]
    assert ep["url"] == engine.url and ep["state"] in ("ready", "busy")
    got = ep["log"]
    assert got["path"] == str(log) and got["reason"] is None
    assert got["load_phase"] == "ready"  # "Application startup complete" is in its end
    assert got["decisive_lines"] == [] and got["tail"]
    assert 0 < got["read_bytes"] <= 128 * 1024
    assert 0 < got["size_bytes"] <= log.stat().st_size  # vLLM may have written more since
