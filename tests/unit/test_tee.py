"""The tee's pure parts (opsctl.console.judge_requests) and its LISTEN=URL parsing."""

from __future__ import annotations

import json

import pytest

from opsctl.console import judge_requests as rq
from opsctl.console.columns import tee_cell
from opsctl.console.tee import parse_tee
from opsctl.console.view_drill_in import requests_lines
from opsctl.errors import BadInput


def sse(*chunks: dict | str) -> bytes:
    out = b""
    for c in chunks:
        out += b"data: " + (c if isinstance(c, str) else json.dumps(c)).encode() + b"\n\n"
    return out


def chat_chunk(content: str | None, role: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    if role:
        delta["role"] = role
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}


USAGE_CHUNK = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def test_parse_request_chat_stream_with_usage_keeps_no_prompt_by_default():
    body = json.dumps(
        {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "secret words"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    s = rq.parse_request("/v1/chat/completions?x=1", body)
    assert (s.endpoint, s.kind, s.model, s.stream, s.include_usage) == (
        "/v1/chat/completions", "chat", "tiny-llama", True, True,
    )  # fmt: skip
    assert s.prompt is None
    kept = rq.parse_request("/v1/chat/completions", body, keep_prompt=True)
    assert kept.prompt == "secret words"


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (b"", (None, False)),
        (b"not json", (None, False)),
        (b"[1, 2]", (None, False)),
        (b'{"model": 5, "stream": "yes"}', (None, False)),
        (b'{"model": "m", "prompt": ["a", "b"]}', ("m", False)),
    ],
)
def test_parse_request_never_raises(body, expect):
    s = rq.parse_request("/v1/completions", body)
    assert (s.model, s.stream) == expect and s.kind == "completions"


def test_recorded_leaves_out_polling_paths():
    assert not rq.recorded("/metrics") and not rq.recorded("/health")
    assert not rq.recorded("/v1/models") and not rq.recorded("/version?x")
    assert rq.recorded("/v1/completions") and rq.recorded("/v1/chat/completions")


def test_stream_counter_uses_the_final_usage_chunk_across_any_split():
    data = sse(chat_chunk("", role="assistant"), chat_chunk("a"), chat_chunk("b"),
               chat_chunk("c"), USAGE_CHUNK, "[DONE]")  # fmt: skip
    c = rq.StreamCounter()
    for i in range(0, len(data), 7):  # bytes arrive in odd pieces
        c.feed(data[i : i + 7], now=float(i))
    assert c.done and c.content_chunks == 3
    assert c.tokens() == (7, 3, rq.FROM_USAGE)
    # the role-only first chunk is not content: TTFT starts at the first "a"
    assert c.first_content_at is not None and c.first_content_at > 0


def test_stream_counter_without_usage_counts_chunks_and_says_so():
    c = rq.StreamCounter()
    c.feed(sse(chat_chunk("", role="assistant")), now=1.0)
    assert c.first_content_at is None and c.tokens() == (None, None, None)
    c.feed(sse({"choices": [{"text": ""}]}, {"choices": [{"text": "y"}]}, "[DONE]"), now=2.0)
    assert c.first_content_at == 2.0  # a token whose text is held back is output too
    assert c.tokens() == (None, 2, rq.FROM_CHUNKS)


def test_usage_of_json_and_responses_api():
    assert rq.body_usage(b'{"usage": {"prompt_tokens": 4, "completion_tokens": 9}}') == (4, 9)
    assert rq.body_usage(b'{"usage": {"input_tokens": 4, "output_tokens": 2}}') == (4, 2)
    assert rq.body_usage(b'{"usage": {"prompt_tokens": 4}}') == (4, None)  # embeddings
    assert rq.body_usage(b'{"data": []}') is None and rq.body_usage(b"oops") is None


def test_adapter_named_by_the_model_field():
    served = rq.served_models(
        {"data": [{"id": "base", "parent": None}, {"id": "sql-lora", "parent": "base"}]}
    )
    assert rq.adapter_for("sql-lora", served) == "sql-lora"
    assert rq.adapter_for("base", served) is None
    assert rq.adapter_for("unknown", served) is None and rq.adapter_for(None, served) is None


def record(**kw) -> rq.RequestRecord:
    base = dict(
        id=1, method="POST", endpoint="/v1/completions", kind="completions", model="m",
        adapter=None, stream=True, started_at=100.0, status=200, ttft_s=0.05,
        duration_s=0.5, prompt_tokens=None, output_tokens=4, tokens_from=rq.FROM_CHUNKS,
        in_flight=False,
    )  # fmt: skip
    base.update(kw)
    return rq.RequestRecord(**base)


def test_views_say_how_tokens_were_counted_and_never_show_an_absent_prompt():
    done = record()
    live = record(id=2, status=None, in_flight=True, duration_s=1.0)
    v = rq.RequestsView("http://127.0.0.1:1", "http://127.0.0.1:2", False, (live,), (done,),
                        2, 0, 0)  # fmt: skip
    d = rq.requests_dict(v)
    assert d is not None and d["requests_in_flight"] == 1 and d["requests_seen"] == 2
    assert [r["id"] for r in d["requests"]] == [2, 1]  # in flight first
    assert d["requests"][1]["tokens_from"] == "chunks" and d["requests"][1]["prompt"] is None
    lines = requests_lines(v)
    assert "1 in flight" in lines[0] and "(chunks counted)" in lines[2]
    assert tee_cell(v) == " · tee 1" and tee_cell(None) == ""
    assert rq.requests_dict(None) is None and requests_lines(None) == []


@pytest.mark.parametrize(
    ("spec", "host", "port", "url"),
    [
        ("127.0.0.1:8100=http://127.0.0.1:8000", "127.0.0.1", 8100, "http://127.0.0.1:8000"),
        ("8100=127.0.0.1:8000", "127.0.0.1", 8100, "http://127.0.0.1:8000"),
        ("localhost:9=http://10.0.0.5:8000/", "127.0.0.1", 9, "http://10.0.0.5:8000"),
    ],
)
def test_parse_tee(spec, host, port, url):
    t = parse_tee(spec)
    assert (t.host, t.port, t.upstream) == (host, port, url)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("127.0.0.1:8100", "LISTEN=URL"),
        ("=http://127.0.0.1:8000", "LISTEN=URL"),
        ("127.0.0.1:x=http://127.0.0.1:8000", "no valid port"),
        ("127.0.0.1:70000=http://127.0.0.1:8000", "out of range"),
        ("0.0.0.0:8100=http://127.0.0.1:8000", "127.0.0.1 only"),
        ("127.0.0.1:8100=ftp://x:1", "URL"),
    ],
)
def test_parse_tee_bad_input(spec, says):
    with pytest.raises(BadInput) as exc:
        parse_tee(spec)
    assert says in str(exc.value)


def test_parse_tee_other_address_when_allowed():
    assert parse_tee("0.0.0.0:8100=http://127.0.0.1:8000", any_address=True).host == "0.0.0.0"


def test_row_and_drill_in_show_the_tee_and_the_log():
    from opsctl.console.judge import EndpointView, EngineInfo, Figures, Target
    from opsctl.console.judge_logview import facts
    from opsctl.console.view_detail import summary_text
    from opsctl.console.view_panel import row_cells

    live = record(id=2, status=None, in_flight=True, stream=True, duration_s=1.0)
    reqs = rq.RequestsView("http://127.0.0.1:1", "http://127.0.0.1:2", False, (live,),
                           (record(),), 2, 0, 0)  # fmt: skip
    log = facts("/var/log/v.log", "(APIServer pid=1) ERROR [x.py:1] ValueError: boom\n", size=50)
    v = EndpointView(Target("a", "http://127.0.0.1:2", "argument"), "busy", None,
                     Figures(running=3.0), EngineInfo(), None, 200, 1.0, 1.0, 2, 0, 0.01,
                     requests=reqs, log=log)  # fmt: skip
    assert row_cells(v, 2.0, 1.0)[4] == "3 · tee 1"
    text = summary_text(v, 2.0, 1.0).plain
    assert "requests (tee http://127.0.0.1:1 -> http://127.0.0.1:2): 1 in flight" in text
    assert "POST /v1/completions" in text and "log /var/log/v.log" in text
    assert "ValueError: boom" in text  # a decisive line, brackets and all
    plain = EndpointView(Target("b", "http://127.0.0.1:3", "argument"), "ready", None,
                         Figures(running=0.0), EngineInfo(), None, 200, 1.0, 1.0, 2, 0, 0.01)  # fmt: skip
    assert (
        row_cells(plain, 2.0, 1.0)[4] == "0"
        and "requests (" not in summary_text(plain, 2.0, 1.0).plain
    )


def test_a_recording_replays_the_requests_and_the_log():
    """console --record/--replay: the tee's records and the log facts come back as
    they were (the replay decodes by the dataclasses' type hints)."""
    from opsctl.console.judge import EndpointView, EngineInfo, Figures, FleetSnapshot, Target
    from opsctl.console.judge_logview import facts
    from opsctl.console.replay import decode, encode

    reqs = rq.RequestsView("l", "u", True, (record(id=2, status=None, in_flight=True),),
                           (record(status=rq.DISCONNECTED, prompt="p"),), 2, 0, 1)  # fmt: skip
    log = facts("/p", "ValueError: x\n", size=14, rotations=1)
    v = EndpointView(Target("a", "http://127.0.0.1:2", "argument"), "ready", None, Figures(),
                     EngineInfo(), None, 200, 1.0, 1.0, 2, 0, 0.01, requests=reqs, log=log)  # fmt: skip
    back = decode(encode(FleetSnapshot(1.0, (v,), 1.0))).endpoints[0]
    assert back.requests == reqs and back.log == log
