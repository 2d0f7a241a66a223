"""I/O for ``opsctl diag lora``: adapter directories, served adapters, requests, records.

Adapter directories on disk, the adapters a server lists or loads at runtime, the requests
(alone, or all at once), and what the engine recorded.

- :func:`read_adapter_dir`: a PEFT adapter directory -> :class:`AdapterDir` (BadInput,
  one line, when it is missing or not an adapter).
- :func:`served` / :func:`load_adapter` / :func:`unload_adapter`: ``/v1/models`` (the
  base model and the LoRA adapters it lists, ``parent`` set) and vLLM's dynamic LoRA
  loading (``/v1/load_lora_adapter``: only on a server started with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, otherwise 404).
- :func:`run_alone` / :func:`run_together`: one request per :class:`LoraRequest`
  (greedy, ignore_eos, logprobs with token ids, a unique ``cache_salt``, a request id
  naming the run); text-only requests go to ``/v1/completions``, requests with images to
  ``/v1/chat/completions`` (one image part per image, PNGs made in memory, each with
  its own ``uuid`` so no request reuses another's encoder output). Together:
  threads released at once by a barrier. Errors become values, never exceptions.
- :func:`engine_facts`: the batch probe's steps, the lora probe's records, the
  engine_info record and the test knobs of the patch ledger, read once the probe shows
  every mixed request (or at a deadline).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from opsctl.collectors import http, ledger
from opsctl.collectors.completions import (
    Timed,
    parse_chat,
    parse_response,
    send_alone,
    send_in_groups,
    timed_post,
)
from opsctl.collectors.mm_uuid import image_data_url
from opsctl.errors import BadInput, EngineUnreachable, OpsTimeout
from opsctl.suite.lora import judge

IMAGE_SIZE = 32
CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True, slots=True)
class AdapterDir:
    """A PEFT adapter directory on disk: its name, path, rank and target modules."""

    name: str
    path: Path
    rank: int
    target_modules: tuple[str, ...]


def read_adapter_dir(raw: str | Path) -> AdapterDir:
    """A PEFT adapter directory (``adapter_config.json`` with an integer ``r``)."""
    path = Path(raw).expanduser()
    if not path.exists():
        raise BadInput(f"adapter directory {raw} does not exist")
    if not path.is_dir():
        raise BadInput(f"adapter path {raw} is not a directory")
    cfg = path / CONFIG_FILE
    try:
        data = json.loads(cfg.read_text())
    except FileNotFoundError:
        raise BadInput(f"adapter directory {raw} has no {CONFIG_FILE}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"cannot read {cfg}: {exc}") from None
    rank = data.get("r") if isinstance(data, dict) else None
    if not isinstance(rank, int) or rank < 1:
        raise BadInput(f"{cfg} has no LoRA rank 'r'")
    targets = data.get("target_modules") or ()
    targets = (targets,) if isinstance(targets, str) else tuple(map(str, targets))
    return AdapterDir(path.resolve().name, path.resolve(), rank, targets)


# ---- the server's adapters -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    """What a server serves: its base model and the LoRA adapters it lists."""

    base: str
    adapters: Mapping[str, str] = field(default_factory=dict)  # name -> root (path)
    base_root: str | None = None  # the base model's path on the server


def _json_file(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_config(root: str | None) -> dict | None:
    """The served model's config.json, when its root is a readable local directory."""
    return _json_file(Path(root) / "config.json") if root else None


def served_adapter(
    name: str, root: str | None
) -> tuple[str, Path | None, tuple[str, ...], int | None]:
    """(name, path, parts, rank) of an adapter a server lists.

    The parts from opsctl's marker and the rank from adapter_config.json when its root is
    readable here."""
    if not root:
        return name, None, (), None
    path = Path(root)
    marker = _json_file(path / ".opsctl-adapter.json") or {}
    config = _json_file(path / CONFIG_FILE) or {}
    rank = config.get("r") if isinstance(config.get("r"), int) else None
    return name, path, tuple(map(str, marker.get("parts") or ())), rank


def _fail(url: str, what: str, exc: httpx.HTTPError) -> Exception:
    if isinstance(exc, httpx.TimeoutException):
        return OpsTimeout(f"{what} at {url} got no answer in time")
    return EngineUnreachable(f"{what} at {url} failed: {type(exc).__name__}")


def served(url: str, *, api_key: str | None = None, timeout: float = 30.0) -> Served:
    """The base model and the LoRA adapters ``/v1/models`` lists (entries with a parent)."""
    try:
        with http.client(api_key, timeout=timeout) as c:
            data = http.check_auth(c.get(f"{url}/v1/models"), api_key).json().get("data") or []
    except httpx.HTTPError as exc:
        raise _fail(url, "GET /v1/models", exc) from None
    except (ValueError, AttributeError):
        raise BadInput(f"{url}/v1/models is not a vLLM model list") from None
    rows = [d for d in data if isinstance(d, dict)]
    bases = [d for d in rows if not d.get("parent")]
    if not bases:
        raise BadInput(f"{url}/v1/models lists no base model")
    adapters = {str(d.get("id")): str(d.get("root")) for d in rows if d.get("parent")}
    root = bases[0].get("root")
    return Served(str(bases[0].get("id")), adapters, str(root) if root else None)


def load_adapter(
    url: str, name: str, path: Path, *, api_key: str | None = None, timeout: float = 120.0
) -> tuple[int, str]:
    """POST /v1/load_lora_adapter -> (HTTP status, text); 404: runtime loading is off."""
    body = {"lora_name": name, "lora_path": str(path)}
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = http.check_auth(c.post(f"{url}/v1/load_lora_adapter", json=body), api_key)
    except httpx.HTTPError as exc:
        raise _fail(url, "POST /v1/load_lora_adapter", exc) from None
    return r.status_code, r.text[:300]


def unload_adapter(url: str, name: str, *, api_key: str | None = None) -> None:
    """Ask the server to unload adapter ``name``; a transport error is ignored."""
    with contextlib.suppress(httpx.HTTPError), http.client(api_key, timeout=30.0) as c:
        c.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})


# ---- requests ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Params:
    """What every request of a LoRA run asks for: base model, tokens, logprobs, timeout."""

    base: str  # the served base model (requests without an adapter)
    max_tokens: int
    logprobs: int
    timeout: float = 120.0


_IMAGES: dict[str, str] = {}


def _image(color: str) -> str:
    if color not in _IMAGES:
        _IMAGES[color] = image_data_url(dict(judge.IMAGE_COLORS)[color], IMAGE_SIZE)
    return _IMAGES[color]


def request_id(tag: str, phase: str, req: judge.LoraRequest) -> str:
    """The request id ``<tag>-<phase>-r<index>-<label>-<hex8>`` of one LoRA request."""
    return f"{tag}-{phase}-r{req.index}-{req.label}-{uuid.uuid4().hex[:8]}"


def body(params: Params, req: judge.LoraRequest, rid: str) -> tuple[str, dict[str, Any]]:
    """(endpoint, JSON body) for one request."""
    common = {
        "model": req.adapter or params.base,
        "max_tokens": params.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "request_id": rid,
        "cache_salt": uuid.uuid4().hex,
    }
    if not req.images:
        return "/v1/completions", {**common, "prompt": req.prompt, "logprobs": params.logprobs}
    # a fresh uuid per image and request: the engine's encoder cache keys on it (with the
    # adapter's name), so every request runs the vision tower itself, alone and batched
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": _image(c)}, "uuid": f"{rid}-i{j}"}
        for j, c in enumerate(req.images)
    ]
    content.append({"type": "text", "text": req.prompt})
    chat = {"messages": [{"role": "user", "content": content}], "logprobs": True}
    return "/v1/chat/completions", {**common, **chat, "top_logprobs": params.logprobs}


def send(client: httpx.Client, url: str, params: Params, req: judge.LoraRequest, rid: str) -> Timed:
    """One request (a chat request when it carries images), timed and parsed."""
    path, payload = body(params, req, rid)
    parse = parse_chat if req.images else parse_response
    return timed_post(client, f"{url}{path}", payload, parse, params.timeout, rid)


OnDone = Callable[[judge.LoraRequest, Timed], None]


def run(
    url: str,
    params: Params,
    requests: Sequence[judge.LoraRequest],
    tag: str,
    on_done: OnDone | None = None,
    *,
    together: bool,
    api_key: str | None = None,
) -> list[Timed]:
    """Send every request: one at a time in order, or all at once behind a barrier.

    Alone: in order, request ids ``-one-`` (``together=False``). Together: one thread each,
    released by a barrier, request ids ``-mix-`` (``together=True``)."""
    phase = "mix" if together else "one"

    def send_one(client: httpx.Client, k: int) -> Timed:
        return send(client, url, params, requests[k], request_id(tag, phase, requests[k]))

    def done(k: int, res: Timed) -> None:
        if on_done:
            on_done(requests[k], res)

    n = len(requests)
    if together and n:
        return send_in_groups(n, n, send_one, done, api_key=api_key)
    return send_alone(n, send_one, done, api_key=api_key)


run_alone = functools.partial(run, together=False)
run_together = functools.partial(run, together=True)


# ---- what the engine recorded -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What the engine recorded for a LoRA run: batch steps, LoRA manager, adapters, swaps."""

    steps: tuple[Mapping[str, Any], ...] = ()  # batch probe records
    manager: Mapping[str, Any] | None = None  # lora probe: the LoRA manager (worker)
    adapters: tuple[Mapping[str, Any], ...] = ()  # lora probe: adapters loaded (last per name)
    swaps: tuple[Mapping[str, Any], ...] = ()  # lora probe: test-knob swaps
    encoder: tuple[Mapping[str, Any], ...] = ()  # lora probe: vision encoder calls
    info: Mapping[str, Any] | None = None  # engine_info probe (EngineCore config)
    gathered: tuple[Mapping[str, Any], ...] = ()  # gate probe: groups released together
    test_knobs: Mapping[str, str] = field(default_factory=dict)


def read_facts(run_dir: Path | None) -> EngineFacts:
    """The LoRA and batch probes' records in ``run_dir``; empty without a run directory."""
    if run_dir is None:
        return EngineFacts()
    records = ledger.read_records(run_dir)
    lora = ledger.read_events(run_dir, judge.PROBE_EVENTS)
    managers = [r for r in lora if r.get("event") == "manager"]
    adapters = {str(r.get("name")): r for r in lora if r.get("event") == "adapter"}
    infos = [r for r in ledger.read_events(run_dir, "engine_info") if "error" not in r]
    return EngineFacts(
        tuple(ledger.read_events(run_dir, "batch")),
        managers[-1] if managers else None,
        tuple(adapters.values()),
        tuple(r for r in lora if r.get("event") == "swap"),
        tuple(r for r in lora if r.get("event") == "encoder"),
        infos[-1] if infos else None,
        tuple(r for r in ledger.read_events(run_dir, "gate") if r.get("event") == "released"),
        ledger.test_knobs(records),
    )


def engine_facts(run_dir: Path | None, tag: str, mixed: int, timeout: float = 3.0) -> EngineFacts:
    """:func:`read_facts` once the batch probe shows every ``mixed`` request (or at timeout).

    The last lines may land just after the responses."""
    deadline = time.monotonic() + timeout
    while True:
        facts = read_facts(run_dir)
        seen = {
            i
            for s in facts.steps
            for i in (judge.request_index(str(r), tag) for r in s.get("req_ids") or [])
            if i is not None
        }
        if not facts.steps or len(seen) >= mixed or time.monotonic() >= deadline:
            return facts
        time.sleep(0.05)
