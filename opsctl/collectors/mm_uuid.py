"""I/O for ``opsctl diag mm-uuid``: chat requests with images, and the engine's records.

- :class:`ChatSender` sends one chat request with one or more images (a small PNG per
  colour, each with its ``uuid`` field as the item says) and waits, with a deadline, for
  the ``mm_uuid`` engine probe's record of that request in the run directory
  (``events/mm_uuid.jsonl``), found by request id only: the engine's id starts with the
  HTTP response id. Returns a frozen :class:`opsctl.suite.mm_uuid.judge.ChatReply`.
- :func:`probe_entries` / :func:`engine_info`: the probe's ledger entries and the
  engine's own record of its cache settings.

Matching items to records and judging them is opsctl.suite.mm_uuid.judge.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from opsctl.collectors import http
from opsctl.collectors.ledger import entries, read_events, read_records
from opsctl.errors import BadInput, EngineUnreachable, OpsTimeout
from opsctl.suite.mm_uuid.judge import ABSENT, COLORS, ChatReply, EngineRecord, Item

PROMPT = "What is in the image?"


def image_data_url(rgb: tuple[int, int, int], size: int = 28) -> str:
    """A PNG data URL: a square of ``rgb`` with an inverted inner square (in memory)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), rgb)
    ImageDraw.Draw(img).rectangle(
        [size // 4, size // 4, size // 2, size // 2],
        fill=(255 - rgb[0], 255 - rgb[1], 255 - rgb[2]),
    )
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def probe_entries(run_dir: Path) -> tuple[tuple[str, str], ...]:
    """(status, detail) of every engine-core ledger entry of the mm_uuid probe."""
    return tuple(
        (e.status, e.detail)
        for e in entries(read_records(run_dir))
        if e.name == "mm_uuid_probe" and e.role == "engine_core"
    )


def engine_info(run_dir: Path) -> dict[str, Any] | None:
    """The engine's newest engine_info event (its cache settings), if any."""
    info = read_events(run_dir, "engine_info")
    return info[-1] if info else None


def engine_record(event: dict[str, Any]) -> EngineRecord:
    """The mm_uuid probe's event as an :class:`EngineRecord` (request id, item ids, error)."""
    items = event.get("items") or []
    return EngineRecord(
        event.get("request_id"),
        tuple(i.get("identifier") if isinstance(i, dict) else None for i in items),
        str(event["error"]) if "error" in event else None,
    )


class ChatSender:
    """Chat requests to one server, each paired with the probe's record of it.

    Use as a context manager."""

    def __init__(
        self,
        url: str,
        run_dir: Path,
        timeout: float = 120.0,
        api_key: str | None = None,
        record_wait: float = 5.0,  # seconds to wait for the probe's record after a reply
    ) -> None:
        self.url, self.run_dir, self.timeout, self.api_key = url, run_dir, timeout, api_key
        self.record_wait = record_wait
        self.client = http.client(api_key, timeout=timeout)
        self.model = ""
        self.images: dict[str, str] = {}

    def __enter__(self) -> ChatSender:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def _timeout(self, what: str) -> OpsTimeout:
        return OpsTimeout(
            f"{what} at {self.url} got no answer within {self.timeout:g} s",
            hint="raise --timeout if the engine is just slow",
        )

    def _call(self, what: str, where: str, send: Callable[[], httpx.Response]) -> httpx.Response:
        """``send()``'s response (checked for authentication); no answer in time is
        OpsTimeout, any other transport error EngineUnreachable ("``what`` ``where``
        URL failed")."""
        try:
            return http.check_auth(send(), self.api_key)
        except httpx.TimeoutException:
            raise self._timeout(what) from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"{what} {where} {self.url} failed: {type(exc).__name__}"
            ) from None

    def served_model(self) -> str:
        """Ask the server which model it serves (``GET /v1/models``); remember it."""
        r = self._call("GET /v1/models", "at", lambda: self.client.get(f"{self.url}/v1/models"))
        try:
            self.model = str(r.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise BadInput(
                f"{self.url}/v1/models returned no model; is this a vLLM server?"
            ) from None
        return self.model

    def _events(self) -> list[dict]:
        return read_events(self.run_dir, "mm_uuid")

    def _part(self, item: Item) -> dict:
        url = self.images.setdefault(item.color, image_data_url(COLORS[item.color]))
        part: dict = {"type": "image_url", "image_url": {"url": url}}
        if item.uuid != ABSENT:
            part["uuid"] = item.uuid
        return part

    def record_for(self, rid: str | None, seen: int) -> EngineRecord | None:
        """The probe's record of request ``rid`` among the events appended since ``seen``.

        None if none arrives within ``record_wait`` seconds."""
        if not rid:
            return None
        deadline = time.monotonic() + self.record_wait
        while True:
            for e in self._events()[seen:]:
                if str(e.get("request_id", "")).startswith(rid):
                    return engine_record(e)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def send(self, items: Sequence[Item]) -> ChatReply:
        """Send ``items`` as the images of ONE chat request."""
        content = [*(self._part(item) for item in items), {"type": "text", "text": PROMPT}]
        body = {
            "model": self.model,
            "max_tokens": 4,
            "temperature": 0,
            "messages": [{"role": "user", "content": content}],
        }
        seen = len(self._events())
        r = self._call(
            "POST /v1/chat/completions",
            "to",
            lambda: self.client.post(f"{self.url}/v1/chat/completions", json=body),
        )
        if r.status_code != 200:
            return ChatReply(r.status_code, error_text=r.text[:300])
        payload = r.json()
        rid = payload.get("id")
        output = payload["choices"][0]["message"].get("content")
        return ChatReply(200, output, rid, self.record_for(rid, seen))
