"""Chat requests with images and logprobs for ``opsctl diag invariance`` on a VLM.

/v1/completions carries no images on vLLM 0.32 (its request has no multimodal field),
so prompts with images go to ``/v1/chat/completions``: one user message of image parts
(PNG data URLs made in memory, opsctl.collectors.mm_uuid.image_data_url) followed by the
prompt's text. Every request is greedy, ``ignore_eos``, asks for ``logprobs`` with
``top_logprobs`` and token ids (``return_tokens_as_token_ids``), names the run, phase
and prompt in its ``request_id`` (``<tag>-p<index>-<hex8>``, like the text requests, so
the batch probe's records map to prompts the same way), sends every image with its own
``uuid`` (``<request id>-img<j>``: the engine core records it, and no request reuses
another's processed image) and a unique ``cache_salt``.

BS=1: one request at a time. BS=N: one chat conversation per request, so the N requests
of a group are sent at once from threads released by a barrier (the batch probe shows
what the engine really batched).

:func:`text_token_counts`: ``/tokenize`` of each prompt's message without its images,
for the usage cross-check when no engine probe shows the images.
Errors become values (``Generated.error``), never exceptions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from opsctl.collectors import http
from opsctl.collectors.completions import (
    CompletionParams,
    Timed,
    gather_marks,
    parse_chat,
    send_alone,
    send_in_groups,
    timed_post,
)
from opsctl.collectors.completions import request_id as make_request_id
from opsctl.collectors.mm_uuid import image_data_url
from opsctl.suite.invariance.judge_images import ENDPOINT, RGB, image_uuid

IMAGE_SIZE = 32
_URLS: dict[RGB, str] = {}
OnDone = Callable[[int, Timed], None]


def image_url(rgb: RGB) -> str:
    """The PNG data URL of an image of colour ``rgb`` (made once, then cached)."""
    if rgb not in _URLS:
        _URLS[rgb] = image_data_url(rgb, IMAGE_SIZE)
    return _URLS[rgb]


def messages(text: str, images: Sequence[RGB], rid: str | None) -> list[dict[str, Any]]:
    """One user message: the images (with their uuids when ``rid`` is given), then text."""
    parts: list[dict[str, Any]] = []
    for j, rgb in enumerate(images):
        part: dict[str, Any] = {"type": "image_url", "image_url": {"url": image_url(rgb)}}
        if rid is not None:
            part["uuid"] = image_uuid(rid, j)
        parts.append(part)
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def chat_body(params: CompletionParams, text: str, images: Sequence[RGB], rid: str) -> dict:
    """The JSON body of a greedy chat request with ``images`` and ``text``, with logprobs."""
    return {
        "model": params.model,
        "messages": messages(text, images, rid),
        "max_tokens": params.max_tokens,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": params.logprobs,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "request_id": rid,
        "cache_salt": uuid.uuid4().hex,
        "stream": False,
    }


def send(
    client: httpx.Client,
    url: str,
    params: CompletionParams,
    text: str,
    images: Sequence[RGB],
    rid: str,
) -> Timed:
    """One chat request with ``text`` and ``images``, timed and parsed."""
    body = chat_body(params, text, images, rid)
    return timed_post(client, f"{url}{ENDPOINT}", body, parse_chat, params.timeout, rid)


def run_alone(
    url: str,
    params: CompletionParams,
    prompts: Sequence[str],
    images: Sequence[Sequence[RGB]],
    tag: str,
    on_done: OnDone | None = None,
    *,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=1: one request at a time, in prompt order."""
    return send_alone(
        len(prompts),
        lambda c, i: send(c, url, params, prompts[i], images[i], make_request_id(tag, i)),
        on_done,
        api_key=api_key,
    )


def run_together(
    url: str,
    params: CompletionParams,
    prompts: Sequence[str],
    images: Sequence[Sequence[RGB]],
    tag: str,
    batch_size: int,
    on_done: OnDone | None = None,
    *,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=N: groups of ``batch_size`` requests sent at once, one group after the other.

    Threads released together by a barrier; each group gathered by the engine's gate probe where
    it runs."""
    marks = gather_marks(len(prompts), batch_size)
    return send_in_groups(
        len(prompts),
        batch_size,
        lambda c, i: send(c, url, params, prompts[i], images[i], make_request_id(tag, i, marks[i])),
        on_done,
        api_key=api_key,
    )


def text_token_counts(
    url: str, model: str, prompts: Sequence[str], *, api_key: str | None = None
) -> list[int | None]:
    """``/tokenize`` count of each prompt's chat message without images.

    Same template as the chat requests; None where the server gave no count."""
    out: list[int | None] = []
    with http.client(api_key, timeout=30.0) as client:
        for text in prompts:
            body = {"model": model, "messages": messages(text, (), None)}
            try:
                r = client.post(f"{url}/tokenize", json=body)
                count = r.json().get("count") if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError):
                count = None
            out.append(count if isinstance(count, int) else None)
    return out
