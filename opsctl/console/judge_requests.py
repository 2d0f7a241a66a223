"""Live requests seen by the console's tee proxy, pure: bodies, tokens, records, views.

What a request body asks for (endpoint, model, stream, whether the final stream chunk carries
usage), what a response says about tokens (``usage`` of a JSON body; for a stream the final usage
chunk when ``stream_options.include_usage`` was asked, else the content chunks counted), the time to
the first content, and the frozen records and views the JSON document and the TUI render. No I/O:
the proxy (opsctl.console.tee) feeds bytes and clock readings in.

Prompt text is kept only when the operator asked (``--tee-keep-prompts``); otherwise a
record's ``prompt`` is None, always.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# how a record's token counts were obtained
FROM_USAGE = "usage"  # the response's usage (JSON body or the final stream chunk)
FROM_CHUNKS = "chunks"  # a stream without usage: output = output chunks counted
DISCONNECTED = "disconnected"  # the client went away before the response ended
UPSTREAM_ERROR = "upstream_error"  # the server could not be reached or broke off
# paths the console itself (and load balancers) poll: relayed, never recorded
POLL_PATHS = frozenset(
    {"/health", "/metrics", "/ping", "/version", "/v1/models", "/server_info", "/load"}
)
KINDS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/pooling": "pooling",
    "/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}
PROMPT_KEEP_CHARS = 2000  # a kept prompt is cut here (a view, not an archive)


def recorded(path: str) -> bool:
    """Whether a request to ``path`` (query string allowed) is one to show."""
    return path.split("?", 1)[0].rstrip("/") not in POLL_PATHS


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What a request body asks for."""

    endpoint: str  # the path without the query string
    kind: str | None  # chat, completions, embeddings, ... (None: another path)
    model: str | None
    stream: bool
    include_usage: bool  # stream_options.include_usage: the last chunk has usage
    prompt: str | None = None  # only when kept


def _prompt_text(body: dict[str, Any]) -> str | None:
    msgs = body.get("messages")
    if isinstance(msgs, list):
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts += [p["text"] for p in c if isinstance(p, dict) and "text" in p]
        return "\n".join(str(p) for p in parts)
    for key in ("prompt", "input"):
        p = body.get(key)
        if isinstance(p, str):
            return p
        if isinstance(p, list):
            return " ".join(str(x) for x in p)
    return None


def parse_request(path: str, body: bytes, keep_prompt: bool = False) -> RequestShape:
    """Never raises: a body that is not a JSON object gives what the path says."""
    endpoint = path.split("?", 1)[0]
    kind = KINDS.get(endpoint.rstrip("/"))
    try:
        doc = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        return RequestShape(endpoint, kind, None, False, False)
    model = doc.get("model")
    opts = doc.get("stream_options")
    prompt = _prompt_text(doc) if keep_prompt else None
    return RequestShape(
        endpoint,
        kind,
        model if isinstance(model, str) else None,
        doc.get("stream") is True,
        isinstance(opts, dict) and opts.get("include_usage") is True,
        prompt[:PROMPT_KEEP_CHARS] if prompt is not None else None,
    )


def usage_of(doc: Any) -> tuple[int | None, int | None] | None:
    """(prompt_tokens, completion_tokens) of a response object's ``usage``; None without."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None

    def num(key: str) -> int | None:
        v = usage.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    out = usage.get("output_tokens") if "completion_tokens" not in usage else None
    completion = num("completion_tokens")
    if completion is None and isinstance(out, int):
        completion = out
    prompt = num("prompt_tokens")
    if prompt is None:
        prompt = num("input_tokens")
    return prompt, completion


def body_usage(body: bytes) -> tuple[int | None, int | None] | None:
    """The usage of a non-streamed JSON response body (None: not JSON, or no usage)."""
    try:
        return usage_of(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        return None


_OUT = ("content", "reasoning_content", "reasoning", "tool_calls")


def _is_output(chunk: dict[str, Any]) -> bool:
    """A chunk of generated output: vLLM sends one per engine step, also when the step's
    text is empty (a token that ends mid-character); the chat role chunk is not one."""
    for c in chunk.get("choices") or ():
        if not isinstance(c, dict):
            continue
        if isinstance(c.get("text"), str):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and "role" not in delta and any(k in delta for k in _OUT):
            return True
    return False


class StreamCounter:
    """Reads an OpenAI server-sent-events stream as it passes: chunks, TTFT and usage.

    Bytes may come in any split. A chunk of output is one engine step (about one token);
    TTFT is when the first arrived; the usage is the final usage chunk's. Mutable; the
    proxy owns one per stream.
    """

    MAX_LINE = 1 << 20  # a line longer than this is not an SSE event we can read

    def __init__(self) -> None:
        self.content_chunks = 0
        self.first_content_at: float | None = None
        self.usage: tuple[int | None, int | None] | None = None
        self.done = False
        self._buf = b""

    def feed(self, data: bytes, now: float) -> None:
        """Read the next bytes of the stream, received at ``now``."""
        self._buf += data
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                if len(self._buf) > self.MAX_LINE:
                    self._buf = b""
                return
            line, self._buf = self._buf[:i].strip(), self._buf[i + 1 :]
            self._line(line, now)

    def _line(self, line: bytes, now: float) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return
        if not isinstance(chunk, dict):
            return
        if _is_output(chunk):
            self.content_chunks += 1
            if self.first_content_at is None:
                self.first_content_at = now
        u = usage_of(chunk)
        if u is not None:
            self.usage = u

    def tokens(self) -> tuple[int | None, int | None, str | None]:
        """(prompt, output, how): the stream's token counts and where they came from.

        (prompt, output, how): from the usage chunk when there was one, else the
        output chunks counted (vLLM sends one per engine step, and merges steps into one
        chunk when its API server falls behind: a lower bound of the tokens; the prompt
        size is then unknown).
        """
        if self.usage is not None:
            return self.usage[0], self.usage[1], FROM_USAGE
        if self.content_chunks:
            return None, self.content_chunks, FROM_CHUNKS
        return None, None, None


def adapter_for(model: str | None, served: Mapping[str, str | None]) -> str | None:
    """The LoRA adapter a request's model field names, or None.

    ``served`` maps each id of the server's /v1/models to its ``parent`` (vLLM sets it for
    adapters, None for the base model). None for the base model or an unknown name.
    """
    if model is None:
        return None
    parent = served.get(model)
    return model if parent and parent != model else None


def served_models(doc: Any) -> dict[str, str | None]:
    """id -> parent from a /v1/models response (empty when it is not one)."""
    data = doc.get("data") if isinstance(doc, dict) else None
    out: dict[str, str | None] = {}
    for m in data if isinstance(data, list) else ():
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            parent = m.get("parent")
            out[m["id"]] = parent if isinstance(parent, str) else None
    return out


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request through the tee: what it asked, its status, tokens and timings."""

    id: int
    method: str
    endpoint: str
    kind: str | None
    model: str | None
    adapter: str | None
    stream: bool
    started_at: float  # wall clock
    status: int | str | None  # None in flight; HTTP code; DISCONNECTED; UPSTREAM_ERROR
    ttft_s: float | None  # to the first content chunk (stream) / first body byte
    duration_s: float | None  # so far while in flight
    prompt_tokens: int | None
    output_tokens: int | None
    tokens_from: str | None  # FROM_USAGE, FROM_CHUNKS, None (not known)
    in_flight: bool
    error: str | None = None
    prompt: str | None = None  # only with --tee-keep-prompts


@dataclass(frozen=True, slots=True)
class RequestsView:
    """One tee's requests at one moment: in flight and finished, with totals.

    In flight oldest first, finished newest first; totals since the tee started.
    """

    listen_url: str
    upstream_url: str
    keep_prompts: bool
    in_flight: tuple[RequestRecord, ...]
    recent: tuple[RequestRecord, ...]
    seen: int  # requests recorded since the start
    errors: int  # finished with HTTP >= 400 or UPSTREAM_ERROR
    disconnected: int


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def record_dict(r: RequestRecord) -> dict[str, Any]:
    """The record as a report's ``requests`` list holds it."""
    return {
        "id": r.id,
        "method": r.method,
        "endpoint": r.endpoint,
        "kind": r.kind,
        "model": r.model,
        "adapter": r.adapter,
        "stream": r.stream,
        "in_flight": r.in_flight,
        "status": r.status,
        "started_at": round(r.started_at, 3),
        "ttft_s": _r(r.ttft_s),
        "duration_s": _r(r.duration_s),
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "tokens_from": r.tokens_from,
        "error": r.error,
        "prompt": r.prompt,
    }


def requests_dict(v: RequestsView | None, limit: int = 50) -> dict[str, Any] | None:
    """The view as a report's ``requests`` object holds it, at most ``limit`` records."""
    if v is None:
        return None
    records = [*v.in_flight, *v.recent][:limit]
    return {
        "listen_url": v.listen_url,
        "upstream_url": v.upstream_url,
        "keep_prompts": v.keep_prompts,
        "requests_in_flight": len(v.in_flight),
        "requests_seen": v.seen,
        "requests_failed": v.errors,
        "requests_disconnected": v.disconnected,
        "requests": [record_dict(r) for r in records],
    }
