"""A stand-in vision-language server and its mm_uuid probe, for diag mm-uuid's tests.

A stand-in for diag mm-uuid's tests: a server that plays a vision-language engine
and its engine-core ``mm_uuid`` probe (it answers chat requests and appends the probe's
records to a run directory), honest or with one of several faults."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.standins.base import StandInVllm, serving


def write_run_dir(run_dir: Path, probe_status: str = "applied", caches_off: bool = True) -> None:
    """Write a run directory whose ledger holds the mm_uuid probe's outcome."""
    (run_dir / "ledger").mkdir(parents=True, exist_ok=True)
    (run_dir / "events").mkdir(exist_ok=True)
    record = {
        "pid": 1,
        "role": "engine_core",
        "time": 1.0,
        "vllm_version": "x",
        "patches": [
            {
                "name": "mm_uuid_probe",
                "status": probe_status,
                "detail": "",
                "reason": "",
                "target": "",
            }
        ],
    }
    (run_dir / "ledger" / "1.json").write_text(json.dumps(record))
    info = {
        "enable_prefix_caching": not caches_off,
        "mm_processor_cache_gb": 0 if caches_off else 4,
    }
    (run_dir / "events" / "engine_info.jsonl").write_text(json.dumps(info) + "\n")


@contextmanager
def stand_in(
    run_dir: Path,
    rewrite: str | None = None,
    caches_off: bool = True,
    *,
    index_offset: int = 0,
    lose: str | None = None,
    extra_item: bool = False,
    swap: bool = False,
    sleep: float = 0.0,
    model_id: str = "fake-vlm",
) -> Iterator[str]:
    """Serve a vision-language stand-in that records mm_uuid probe events; yields its URL.

    Plays the engine and its probe. Faults: ``rewrite`` one UUID; request-local ids
    with a wrong index (``index_offset``); the record of the request carrying UUID
    ``lose`` filed under another request id; an ``extra_item`` in every record; the
    recorded items in reverse order (``swap``: a UUID moved to another item); ``sleep``
    before answering a chat request. It serves ``model_id`` (fake-vlm: unknown to opsctl,
    so one image per request)."""
    counter = {"n": 0}

    class H(StandInVllm):
        VERSION = None

        def models(self) -> list[dict]:
            return [{"id": model_id}]

        def metrics_text(self) -> None:
            return None

        def post(self, path: str, body: dict) -> bool:
            time.sleep(sleep)
            parts = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
            counter["n"] += 1
            rid = f"chatcmpl-{counter['n']:04d}"
            items = []
            for i, part in enumerate(parts):
                uuid = part.get("uuid")
                if uuid is None:
                    ident = (
                        f"renderer0-mm-{counter['n']}-image-{i + index_offset}"
                        if caches_off
                        else hashlib.sha256(part["image_url"]["url"].encode()).hexdigest()
                    )
                else:
                    ident = uuid + "~rewritten" if uuid == rewrite else uuid
                items.append({"index": i, "modality": "image", "identifier": ident})
            if swap:
                items.reverse()
            if extra_item:
                items.append({"index": len(items), "modality": "image", "identifier": "x"})
            lost = lose is not None and any(p.get("uuid") == lose for p in parts)
            event = {"request_id": f"{'other' if lost else rid}-abcd", "items": items}
            with open(run_dir / "events" / "mm_uuid.jsonl", "a") as fh:
                fh.write(json.dumps(event) + "\n")
            self._send(
                200, {"id": rid, "choices": [{"message": {"content": items[0]["identifier"][:3]}}]}
            )
            return True

    with serving(H) as url:
        yield url
