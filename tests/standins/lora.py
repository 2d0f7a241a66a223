"""A stand-in vLLM server with LoRA adapters, for diag lora against a URL.

A stand-in vLLM server with LoRA adapters, for `diag lora` against a URL without an
engine: /v1/models lists the base model and its adapters (``parent`` set), completions
give deterministic tokens and logprobs per (model, prompt) (greedy: the sampled token is
the top-1), and vLLM's dynamic LoRA endpoints answer 404 unless runtime loading is
allowed (as with VLLM_ALLOW_RUNTIME_LORA_UPDATING). Options (:class:`Behaviour`):

- ``adapters``: name -> root of the adapters served from the start;
- ``allow_load``: /v1/load_lora_adapter and /v1/unload_lora_adapter exist;
- ``inert``: adapter names that answer exactly like the base model (not applied).
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.standins.base import StandInVllm, serving

BASE = "stand-in-base"
VERSION = "0.0-standin"


@dataclass
class Behaviour:
    """The LoRA stand-in's adapters and options, and the loads it recorded."""

    adapters: dict[str, str] = field(default_factory=dict)
    allow_load: bool = False
    inert: set[str] = field(default_factory=set)
    loaded: list[tuple[str, str]] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    models_used: list[str] = field(default_factory=list)
    prompts_used: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def completion(model: str, prompt: str, max_tokens: int, k: int) -> dict:
    """A deterministic completion with logprobs for (model, prompt)."""
    seed = zlib.crc32(f"{model}|{prompt}".encode())
    tokens, lps, tops = [], [], []
    for pos in range(max_tokens):
        tok = (seed + 37 * pos) % 300
        lp = -0.5 - ((seed >> 4) + pos) % 13 / 10.0
        tokens.append(f"token_id:{tok}")
        lps.append(lp)
        tops.append({f"token_id:{(tok + j) % 300}": lp - j for j in range(max(k, 1))})
    logprobs = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops}
    return {"choices": [{"index": 0, "text": "", "logprobs": logprobs, "finish_reason": "length"}]}


def handler_for(behaviour: Behaviour) -> type[StandInVllm]:
    """A handler class serving the base model, its adapters and the LoRA endpoints."""

    class Handler(StandInVllm):
        VERSION = VERSION

        def models(self) -> list[dict]:
            with behaviour.lock:
                rows = [{"id": n, "root": r, "parent": BASE} for n, r in behaviour.adapters.items()]
            return [{"id": BASE, "root": None, "parent": None}, *rows]

        def metrics_text(self) -> None:
            return None

        def post(self, path: str, body: dict) -> bool:
            if path == "/v1/completions":
                self._complete(body)
            elif path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and (
                behaviour.allow_load
            ):
                with behaviour.lock:
                    name = body["lora_name"]
                    if path.endswith("/load_lora_adapter"):
                        behaviour.adapters[name] = body["lora_path"]
                        behaviour.loaded.append((name, body["lora_path"]))
                    else:
                        behaviour.adapters.pop(name, None)
                        behaviour.unloaded.append(name)
                self._send(200, {})
            else:
                return False
            return True

        def _complete(self, body: dict) -> None:
            model = body.get("model")
            with behaviour.lock:
                known = model == BASE or model in behaviour.adapters
                behaviour.models_used.append(str(model))
                behaviour.prompts_used.append(str(body.get("prompt")))
            if not known:
                self._send(404, {"error": {"message": f"The model `{model}` does not exist."}})
                return
            effective = BASE if model in behaviour.inert else str(model)
            self._send(
                200,
                completion(
                    effective,
                    body["prompt"],
                    int(body["max_tokens"]),
                    int(body.get("logprobs") or 0),
                ),
            )

    return Handler


@contextlib.contextmanager
def lora_server(behaviour: Behaviour) -> Iterator[str]:
    """Serve the LoRA stand-in of ``behaviour``; yields its URL."""
    with serving(handler_for(behaviour)) as url:
        yield url
