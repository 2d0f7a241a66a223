"""A stand-in generative vLLM server (completions, chat, /tokenize) for invariance and certify.

A stand-in vLLM server for `diag invariance`: /v1/completions with deterministic
tokens and logprobs (greedy: the sampled token is the top-1 at every position), and
/metrics counters that move like vLLM's (one engine step per output position of a
request; the prompts of one multi-prompt request share their steps). Options
(:class:`Behaviour`):

- ``diverge=(marker, position, delta)``: a prompt containing ``marker`` gets ``delta``
  added to its logprob at ``position`` when it is batched with others (a multi-prompt
  request), like the engine's test nudge: the token stays the same;
- ``run_dir``: written like the run directory of an engine opsctl started (batch probe
  init and step records, engine_info, a ledger record with the vLLM version and test
  knobs); :func:`register_run` makes find_run_dir() find it for the stand-in's URL;
- ``jitter``: every request's logprobs move by up to ``jitter`` (a different amount per
  request id, prompt and position, tokens unchanged): run-to-run noise like a GPU's, the
  noise floor a calibrated comparison measures (BS=1 twice);
- ``max_logprobs``: asking for more is HTTP 400 with vLLM's message;
- ``generative=False``: /v1/completions answers 404 (a pooling model).

As a vision-language server (``model`` "tiny-vlm-multi", or a run directory whose
engine_info says ``multimodal``): /v1/chat/completions answers with chat logprobs that
depend on the text and the images, ``usage.prompt_tokens`` counting
``IMAGE_TOKENS`` per image, and /tokenize counts a message's text. Requests in flight
at once are "batched" (``solo``: the next so many are scheduled alone, as when they reach
the engine one after another): each holds ``hold`` seconds and the run directory gets the
``mm_uuid`` probe's record of its images (with the uuids sent) and batch-probe steps
and encoder records naming every chat request in flight. ``drop_images``: a server
that silently ignores images (no image tokens, no mm_uuid record, no encoder call).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.standins.base import StandInVllm, serving

MODEL = "stand-in-llama"
IMAGE_TOKENS = 7  # what one image adds to usage.prompt_tokens (tiny-vlm-multi's count)
VERSION = "0.0-standin"
ENGINE_INFO = {
    "enable_prefix_caching": False,
    "mm_processor_cache_gb": None,
    "enforce_eager": True,
    "compilation_mode": "0",
    "platform": "cpu",
}


@dataclass
class Behaviour:
    """How the generative stand-in answers, and what it counted."""

    diverge: tuple[str, int, float] | None = None
    run_dir: Path | None = None
    max_logprobs: int = 20
    generative: bool = True
    steps: int = 0  # vllm:iteration_tokens_total_count
    tokens: int = 0  # vllm:generation_tokens_total
    bodies: list[dict] = field(default_factory=list)  # every /v1/completions body
    lock: threading.Lock = field(default_factory=threading.Lock)
    model: str = MODEL
    drop_images: bool = False
    hold: float = 0.2  # seconds a chat request stays in flight (its "batch")
    inflight: dict[str, int] = field(default_factory=dict)  # engine id -> images
    chats: list[dict] = field(default_factory=list)  # every chat body
    encoded: set[str] = field(default_factory=set)  # engine ids whose images "ran"
    solo: int = 0  # the next this many chat requests are "scheduled" alone
    split: int = 0  # the next this many list requests are "scheduled" in two halves
    jitter: float = 0.0  # run-to-run logprob noise per request (see the module doc)


def _token(prompt: str, pos: int) -> int:
    return (zlib.crc32(prompt.encode()) + 31 * pos) % 1000


def _logprob(prompt: str, pos: int) -> float:
    return -0.25 - ((zlib.crc32(prompt.encode()) >> 3) + pos) % 17 / 8.0


def choice(prompt: str, index: int, max_tokens: int, logprobs: int | None, shift: dict) -> dict:
    """One choice of ``max_tokens`` tokens; ``shift``: position -> logprob delta."""
    toks, lps, tops = [], [], []
    for pos in range(max_tokens):
        tok, lp = _token(prompt, pos), _logprob(prompt, pos) + shift.get(pos, 0.0)
        others = {f"token_id:{1000 + k}": lp - 1.0 - k for k in range(max(0, (logprobs or 0) - 1))}
        toks.append(f"token_id:{tok}")
        lps.append(lp)
        tops.append({f"token_id:{tok}": lp, **others})
    lp_obj = {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops}
    return {
        "index": index,
        "text": "x" * max_tokens,
        "finish_reason": "length",
        "logprobs": None if logprobs is None else lp_obj,
    }


def completion(b: Behaviour, body: dict) -> tuple[int, dict]:
    """The answer to one /v1/completions body (and the counters and probe records)."""
    if not b.generative:
        return 404, {"detail": "Not Found"}
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs > b.max_logprobs:
        msg = f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {b.max_logprobs}"
        return 400, {"error": {"message": msg}}
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    max_tokens = int(body.get("max_tokens") or 16)
    batched = len(prompts) > 1
    choices = []
    rid = str(body.get("request_id") or "anon")
    for i, p in enumerate(prompts):
        shift = {}
        if b.jitter:
            shift = {k: b.jitter * (zlib.crc32(f"{rid}/{i}/{k}".encode()) % 997) / 997 for k in range(max_tokens)}  # fmt: skip
        if b.diverge and batched and b.diverge[0] in p:
            shift[b.diverge[1]] = shift.get(b.diverge[1], 0.0) + b.diverge[2]
        choices.append(choice(p, i, max_tokens, logprobs, shift))
    with b.lock:
        b.bodies.append(body)
        b.steps += max_tokens
        b.tokens += max_tokens * len(prompts)
        if b.run_dir is not None:
            ids = [f"cmpl-{rid}-{i}-ffff0000" for i in range(len(prompts))]
            groups = [ids]
            if b.split and batched:  # the first half ran before the rest arrived
                b.split -= 1
                groups = [ids[: len(ids) // 2], ids[len(ids) // 2 :]]
            steps = [
                {"event": "step", "num_reqs": len(g), "req_ids": g} for g in groups
            ] * max_tokens
            _append(b.run_dir / "events" / "batch.jsonl", steps)
    return 200, {"id": f"cmpl-{rid}", "model": MODEL, "choices": choices}


def _append(path: Path, records: list[dict]) -> None:
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def _chat_parts(body: dict) -> tuple[str, list[dict]]:
    (message,) = body["messages"]
    parts = message["content"]
    text = " ".join(p["text"] for p in parts if p.get("type") == "text")
    return text, [p for p in parts if p.get("type") == "image_url"]


def chat_choice(key: str, max_tokens: int, k: int, shift: dict) -> dict:
    """One chat choice of ``max_tokens`` deterministic tokens with their logprobs."""
    content = []
    for pos in range(max_tokens):
        tok, lp = _token(key, pos), _logprob(key, pos) + shift.get(pos, 0.0)
        tops = [{"token": f"token_id:{tok}", "logprob": lp}]
        tops += [{"token": f"token_id:{1000 + j}", "logprob": lp - 1.0 - j} for j in range(k - 1)]
        content.append({"token": f"token_id:{tok}", "logprob": lp, "top_logprobs": tops})
    return {"index": 0, "finish_reason": "length", "logprobs": {"content": content}}


def _record_chat(b: Behaviour, rid: str, images: list[dict], steps: int, solo: bool) -> None:
    """Probe records of one chat request (the caller holds ``b.lock``)."""
    if b.run_dir is None:
        return
    ev = b.run_dir / "events"
    batch = {rid: b.inflight[rid]} if solo else b.inflight
    if not b.drop_images and images:
        items = [{"index": j, "identifier": p.get("uuid")} for j, p in enumerate(images)]
        _append(ev / "mm_uuid.jsonl", [{"request_id": rid, "items": items}])
        encoded = {r: n for r, n in batch.items() if n and r not in b.encoded}
        b.encoded.update(encoded)
        if encoded:
            _append(ev / "batch.jsonl", [{"event": "encoder", "items": encoded}])
    ids = list(batch)
    _append(ev / "batch.jsonl", [{"event": "step", "num_reqs": len(ids), "req_ids": ids}] * steps)


def chat(b: Behaviour, body: dict) -> tuple[int, dict]:
    """The answer to one /v1/chat/completions body (images are part of the input)."""
    text, images = _chat_parts(body)
    max_tokens, k = int(body.get("max_tokens") or 16), int(body.get("top_logprobs") or 0)
    rid = f"chatcmpl-{body.get('request_id') or 'anon'}-ffff0000"
    seen = [] if b.drop_images else images
    key = text + "|" + "|".join(p["image_url"]["url"] for p in seen)
    with b.lock:
        b.chats.append(body)
        b.inflight[rid] = len(seen)
        solo, b.solo = b.solo > 0, max(0, b.solo - 1)
    time.sleep(b.hold)  # the others of a group arrive meanwhile: one "batch"
    with b.lock:
        batched = len(b.inflight) > 1 and not solo
        _record_chat(b, rid, images, max_tokens, solo)
    shift = {b.diverge[1]: b.diverge[2]} if b.diverge and batched and b.diverge[0] in text else {}
    time.sleep(b.hold)
    with b.lock:
        b.inflight.pop(rid)
        b.steps += max_tokens
        b.tokens += max_tokens
    usage = {"prompt_tokens": len(text.split()) + IMAGE_TOKENS * len(seen)}
    return 200, {"id": rid, "choices": [chat_choice(key, max_tokens, k, shift)], "usage": usage}


def tokenize(body: dict) -> dict:
    """The /tokenize answer: words plus IMAGE_TOKENS per image of a chat body."""
    text, images = _chat_parts(body)
    return {"count": len(text.split()) + IMAGE_TOKENS * len(images)}


def metrics(b: Behaviour) -> str:
    """The /metrics body: the step and token counters the requests moved."""
    return (
        "vllm:num_requests_running 0\n"
        f"vllm:generation_tokens_total {float(b.tokens)}\n"
        f"vllm:iteration_tokens_total_count {float(b.steps)}\n"
    )


def handler_for(b: Behaviour) -> type[StandInVllm]:
    """A handler class serving the completions, chat and /tokenize of ``b``."""

    class Handler(StandInVllm):
        VERSION = VERSION

        def models(self) -> list[dict]:
            return [{"id": b.model}]

        def metrics_text(self) -> str:
            return metrics(b)

        def post(self, path: str, body: dict) -> bool:
            if path == "/v1/chat/completions":
                self._send(*chat(b, body))
            elif path == "/tokenize":
                self._send(200, tokenize(body))
            elif path == "/v1/completions":
                self._send(*completion(b, body))
            else:
                return False
            return True

    return Handler


def write_run_dir(
    run_dir: Path,
    *,
    info: dict | None = None,
    env: dict | None = None,
    nudge: dict | None = None,
    knobs: dict | None = None,
    patches: list[dict] | None = None,
) -> Path:
    """Write the stand-in's run directory (engine info, init event, ledger); returns it.

    A run directory as opsctl's engine leaves it (before any request); ``patches``:
    the ledger's patch entries (e.g. the mm_uuid probe applied)."""
    (run_dir / "events").mkdir(parents=True, exist_ok=True)
    (run_dir / "ledger").mkdir(exist_ok=True)
    _append(run_dir / "events" / "engine_info.jsonl", [info or ENGINE_INFO])
    init = {
        "event": "init",
        "role": "worker",
        "platform": "cpu",
        "env": env if env is not None else {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
        "nudge": nudge,
    }
    _append(run_dir / "events" / "batch.jsonl", [init])
    record = {"pid": os.getpid(), "time": time.time(), "role": "api", "vllm_version": VERSION}
    record.update({"patches": patches or [], "test_knobs": knobs or {}})
    (run_dir / "ledger" / f"{os.getpid()}.json").write_text(json.dumps(record))
    return run_dir


def register_run(run_dir: Path, url: str) -> None:
    """meta.json naming ``url`` and a live pid (this process): find_run_dir(url) finds it."""
    meta = {"url": url, "pid": os.getpid(), "started_at": time.time()}
    (run_dir / "meta.json").write_text(json.dumps(meta))


@contextlib.contextmanager
def completions_server(behaviour: Behaviour | None = None) -> Iterator[tuple[str, Behaviour]]:
    """Serve the generative stand-in; yields (its URL, its Behaviour)."""
    b = behaviour or Behaviour()
    with serving(handler_for(b)) as url:
        yield url, b
