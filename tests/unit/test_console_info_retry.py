"""Engine facts (/version, /v1/models, /server_info) on a starved server: a fetch that
got no answer for one path is tried again at the next poll, and never erases what an
earlier fetch learnt. (A fresh clone showed `vLLM -  model -` on a busy endpoint for a
minute: a timed-out /version had counted as fetched.)"""

from __future__ import annotations

import asyncio
import json

import httpx

from opsctl.collectors import scrape
from opsctl.console.judge import EngineInfo, ModelInfo
from opsctl.console.judge_state import merge_info

MODELS = {"data": [{"id": "tiny-llama", "max_model_len": 256, "root": "/m"}]}


def client(slow: set[str]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in slow:
            raise httpx.ReadTimeout("starved", request=request)
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if request.url.path == "/v1/models":
            return httpx.Response(200, content=json.dumps(MODELS))
        return httpx.Response(404)  # /server_info without VLLM_SERVER_DEV_MODE: an answer

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def fetch(slow: set[str]) -> EngineInfo:
    async def go() -> EngineInfo:
        async with client(slow) as c:
            info, _ = await scrape.fetch_info(c, "http://127.0.0.1:9", 1.0)
            return info

    return asyncio.run(go())


def test_a_fetch_with_every_path_answered_is_complete():
    info = fetch(set())
    assert info.version == "0.32.0" and info.models[0].max_model_len == 256
    assert info.server_info is None and info.fetched_at is not None  # a 404 is an answer


def test_a_timed_out_path_leaves_the_fetch_incomplete():
    info = fetch({"/version"})
    assert info.version is None and info.models and info.fetched_at is None


def test_merge_keeps_what_an_incomplete_fetch_missed_and_asks_again():
    old = EngineInfo("0.32.0", (ModelInfo("tiny-llama", 256, "/m"),), None, 100.0)
    partial = EngineInfo(None, (ModelInfo("tiny-llama", 256, "/m"),), None, None)
    merged = merge_info(old, partial)
    assert merged.version == "0.32.0" and merged.fetched_at == 100.0  # still due
    assert merge_info(EngineInfo(), partial).fetched_at is None  # next poll asks again
    fresh = EngineInfo("0.33.0", (), None, 200.0)
    assert merge_info(old, fresh) == fresh  # a complete fetch replaces (a restart's new model)
