"""Completion requests with logprobs for ``opsctl diag invariance`` (BS=1 and BS=N).

Each prompt alone (BS=1, one request at a time) or all together (BS=N): by default one request
carrying the N prompts (the API server hands them to the engine at once), or N separate requests
sent at once from threads released by a barrier.

Every request is greedy (temperature 0), ``ignore_eos``, asks for ``logprobs`` top
logprobs with token ids (``return_tokens_as_token_ids``), carries a request id that
names the run, phase and prompt (``<tag>-p<index>-...``; the engine's batch probe and
server logs show it) and a unique ``cache_salt`` so no two requests share prefix-cache
blocks even on a server where prefix caching is on.

Returns frozen :class:`opsctl.domain.generation.Generated` values; a request error is a
value with ``error`` set, never an exception. Every client carries the server's API key
(``api_key``, opsctl.collectors.http); the one-shot look-ups (served_model, ...) raise
the typed "authentication required" error on 401/403.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from opsctl.collectors import http
from opsctl.collectors.metrics import fetch_metrics
from opsctl.domain.generation import Generated, TokenKey
from opsctl.domain.metrics import GEN_TOKENS, RUNNING, STEPS

TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True, slots=True)
class CompletionParams:
    """What every completion request of a run asks for: model, tokens, logprobs, timeout."""

    model: str
    max_tokens: int
    logprobs: int
    timeout: float = 120.0


@dataclass(frozen=True, slots=True)
class Timed:
    """One request's generated output, how long it took and its request id."""

    generated: Generated
    seconds: float
    request_id: str


def token_key(raw: str) -> TokenKey:
    """``"token_id:42"`` -> 42 (vLLM with return_tokens_as_token_ids); else the string."""
    if raw.startswith(TOKEN_ID_PREFIX):
        try:
            return int(raw[len(TOKEN_ID_PREFIX) :])
        except ValueError:
            return raw
    return raw


def request_body(params: CompletionParams, prompt: str, request_id: str) -> dict:
    """The JSON body of a greedy /v1/completions request with logprobs for ``prompt``."""
    return {
        "model": params.model,
        "prompt": prompt,
        "max_tokens": params.max_tokens,
        "temperature": 0.0,
        "logprobs": params.logprobs,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
        "request_id": request_id,
        "cache_salt": uuid.uuid4().hex,
        "stream": False,
    }


def parse_response(status: int, payload: object) -> Generated:
    """A /v1/completions response -> Generated (error set when it is not usable)."""
    if status != 200:
        msg = payload.get("error", payload) if isinstance(payload, dict) else payload
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        return Generated(error=f"HTTP {status}: {str(msg)[:300]}")
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return Generated(error="response has no choices list")
    choices = payload["choices"]
    if not choices:
        return Generated(outputs=0)
    choice = choices[0]
    lp = choice.get("logprobs") if isinstance(choice, dict) else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    if not isinstance(lp, dict):
        return Generated(finish_reason=finish, outputs=len(choices), has_logprobs=False)
    tokens = tuple(token_key(str(t)) for t in lp.get("tokens") or [])
    values = tuple(None if v is None else float(v) for v in lp.get("token_logprobs") or [])
    tops: list[dict[TokenKey, float] | None] = []
    for top in lp.get("top_logprobs") or []:
        tops.append(
            None
            if not isinstance(top, dict)
            else {token_key(str(k)): float(v) for k, v in top.items() if v is not None}
        )
    return Generated(tokens, values, tuple(tops), finish, len(choices), None, True)


def _prompt_tokens(payload: dict) -> int | None:
    usage = payload.get("usage")
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


def parse_chat(status: int, payload: object) -> Generated:
    """A /v1/chat/completions response with logprobs -> Generated (with usage).

    A top-logprob entry without a logprob is left out (never ``float(None)``)."""
    if (
        status != 200
        or not isinstance(payload, dict)
        or not isinstance(payload.get("choices"), list)
    ):
        return parse_response(status, payload)
    choices = payload["choices"]
    if not choices:
        return Generated(outputs=0, prompt_tokens=_prompt_tokens(payload))
    choice = choices[0] if isinstance(choices[0], dict) else {}
    finish = choice.get("finish_reason")
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return Generated(finish_reason=finish, outputs=len(choices), has_logprobs=False)
    tokens: list[TokenKey] = []
    values: list[float | None] = []
    tops: list[dict[TokenKey, float] | None] = []
    for item in content:
        tokens.append(token_key(str(item.get("token"))))
        values.append(None if item.get("logprob") is None else float(item["logprob"]))
        tops.append(
            {
                token_key(str(t["token"])): float(t["logprob"])
                for t in item.get("top_logprobs") or []
                if t.get("logprob") is not None
            }
        )
    return Generated(
        tuple(tokens),
        tuple(values),
        tuple(tops),
        finish,
        len(choices),
        None,
        True,
        _prompt_tokens(payload),
    )


def response_payload(r: httpx.Response) -> object:
    """The response's JSON, or its text when the body is not JSON."""
    try:
        return r.json()
    except ValueError:
        return r.text


def timed_post(
    client: httpx.Client,
    url: str,
    body: dict,
    parse: Callable[[int, object], Generated],
    timeout: float,
    request_id: str,
) -> Timed:
    """POST ``body`` to ``url``, time it and parse the answer into a :class:`Generated`.

    ``parse(status, payload)`` makes the :class:`Generated`; a transport error becomes one with
    ``error`` set."""
    t0 = time.perf_counter()
    try:
        r = client.post(url, json=body, timeout=timeout)
        gen = parse(r.status_code, response_payload(r))
    except httpx.HTTPError as exc:
        gen = Generated(error=f"{type(exc).__name__}: {exc}")
    return Timed(gen, time.perf_counter() - t0, request_id)


def complete(
    client: httpx.Client, url: str, params: CompletionParams, prompt: str, request_id: str
) -> Timed:
    """One /v1/completions request for ``prompt``, timed and parsed."""
    body = request_body(params, prompt, request_id)
    return timed_post(
        client, f"{url}/v1/completions", body, parse_response, params.timeout, request_id
    )


def request_id(tag: str, index: int, gather: str = "") -> str:
    """``<tag>-p<index>-<hex8>``, then the group's gather marker when there is one."""
    return f"{tag}-p{index}-{uuid.uuid4().hex[:8]}" + (f"-{gather}" if gather else "")


def gather_marks(n: int, batch_size: int) -> list[str]:
    """Per request index, the gather marker of its group of ``batch_size``.

    The last group may be smaller: an engine with opsctl's ``gate`` probe schedules a group
    only once all its requests arrived; other servers ignore the marker."""
    from engine_patches.patches.batch_gate import marker

    out: list[str] = []
    for start in range(0, n, batch_size):
        size = min(batch_size, n - start)
        out += [marker(size)] * size
    return out


SendOne = Callable[[httpx.Client, int], Timed]


def send_alone(
    n: int,
    send_one: SendOne,
    on_done: Callable[[int, Timed], None] | None = None,
    *,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=1: requests 0..n-1 one at a time, in order (``send_one(client, i)`` sends one)."""
    out: list[Timed] = []
    with http.client(api_key) as client:
        for i in range(n):
            res = send_one(client, i)
            out.append(res)
            if on_done:
                on_done(i, res)
    return out


def send_in_groups(
    n: int,
    batch_size: int,
    send_one: SendOne,
    on_done: Callable[[int, Timed], None] | None = None,
    *,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=N as separate requests: each group sent at once from threads behind a barrier.

    The next group goes after the previous one finished. Closer to real traffic, but a busy API
    server may hand some of them to the engine after the others finished (the batch probe shows
    it)."""
    results: list[Timed | None] = [None] * n
    limits = http.limits(batch_size + 2)
    with http.client(api_key, limits=limits) as client:
        for start in range(0, n, batch_size):
            group = list(range(start, min(start + batch_size, n)))
            barrier = threading.Barrier(len(group))

            def work(i: int, barrier: threading.Barrier = barrier) -> None:
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=30)
                results[i] = send_one(client, i)
                if on_done:
                    on_done(i, results[i])  # type: ignore[arg-type]

            threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in group]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    return [
        r if r is not None else Timed(Generated(error="request thread did not finish"), 0.0, "")
        for r in results
    ]


def run_alone(
    url: str,
    params: CompletionParams,
    prompts: list[str],
    tag: str,
    on_done: Callable[[int, Timed], None] | None = None,
    *,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=1: one request at a time, in prompt order."""
    return send_alone(
        len(prompts),
        lambda c, i: complete(c, url, params, prompts[i], request_id(tag, i)),
        on_done,
        api_key=api_key,
    )


def run_together(
    url: str,
    params: CompletionParams,
    prompts: list[str],
    tag: str,
    batch_size: int,
    on_done: Callable[[int, Timed], None] | None = None,
    *,
    one_request: bool = False,
    api_key: str | None = None,
) -> list[Timed]:
    """BS=N: groups of ``batch_size`` prompts sent at once.

    As separate requests (see send_in_groups), each group gathered by the engine's gate
    probe where it runs; with ``one_request``, each group in ONE request (see
    :func:`send_lists`)."""
    if one_request:
        return send_lists(url, params, prompts, tag, batch_size, on_done, api_key)
    marks = gather_marks(len(prompts), batch_size)
    return send_in_groups(
        len(prompts),
        batch_size,
        lambda c, i: complete(c, url, params, prompts[i], request_id(tag, i, marks[i])),
        on_done,
        api_key=api_key,
    )


run_together_list = functools.partial(run_together, one_request=True)


def group_request_id(tag: str, start: int) -> str:
    """The request id of a multi-prompt request: ``<tag>-g<start>-<hex8>``."""
    return f"{tag}-g{start}-{uuid.uuid4().hex[:8]}"


def parse_choices(status: int, payload: object, n: int) -> list[Generated]:
    """A multi-prompt /v1/completions response -> one Generated per prompt.

    Matched by choice index; a prompt without its choice gets ``outputs=0`` (fail closed)."""
    if (
        status != 200
        or not isinstance(payload, dict)
        or not isinstance(payload.get("choices"), list)
    ):
        err = parse_response(status, payload)
        return [err] * n
    by_index: dict[int, list[dict]] = {}
    for pos, choice in enumerate(payload["choices"]):
        idx = choice.get("index", pos) if isinstance(choice, dict) else pos
        by_index.setdefault(int(idx), []).append(choice)
    return [parse_response(200, {"choices": by_index.get(i, [])}) for i in range(n)]


def send_lists(
    url: str,
    params: CompletionParams,
    prompts: list[str],
    tag: str,
    batch_size: int,
    on_done: Callable[[int, Timed], None] | None,
    api_key: str | None,
) -> list[Timed]:
    """BS=N: each group of ``batch_size`` prompts in ONE request (``prompt`` is a list).

    The API server hands all of them to the engine at once. Engine request ids are
    ``cmpl-<tag>-g<start>-<hex8>-<i>-...`` (prompt ``start + i``)."""
    out: list[Timed] = []
    with http.client(api_key) as client:
        for start in range(0, len(prompts), batch_size):
            group = prompts[start : start + batch_size]
            rid = group_request_id(tag, start)
            body = {**request_body(params, "", rid), "prompt": group}
            t0 = time.perf_counter()
            try:
                r = client.post(f"{url}/v1/completions", json=body, timeout=params.timeout)
                gens = parse_choices(r.status_code, response_payload(r), len(group))
            except httpx.HTTPError as exc:
                gens = [Generated(error=f"{type(exc).__name__}: {exc}")] * len(group)
            secs = time.perf_counter() - t0
            for i, g in enumerate(gens):
                res = Timed(g, secs, f"{rid}-{i}")
                out.append(res)
                if on_done:
                    on_done(start + i, res)
    return out


class RunningSampler:
    """What /metrics says about the BS=N phase.

    Conclusive part: the engine-step and generated-token counters read before and after
    (``vllm:iteration_tokens_total`` is observed once per engine step): N tokens from
    fewer than N steps means some step carried two or more requests. Sampling the
    ``vllm:num_requests_running`` gauge in a thread is kept as a second view, but a short
    batch can start and finish between two scrapes, so it alone proves nothing.
    """

    def __init__(self, url: str, period: float = 0.25, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.period = period
        self.samples: list[float] = []
        self.error: str | None = None
        self.steps: int | None = None  # engine steps during the phase (counter delta)
        self.tokens: int | None = None  # generated tokens during the phase (counter delta)
        self._base: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _counters(self, client: httpx.Client) -> tuple[float, float] | None:
        snap = fetch_metrics(client, self.url)
        if snap.error:
            self.error = snap.error
            return None
        steps, tokens = snap.get(STEPS), snap.get(GEN_TOKENS)
        return None if steps is None or tokens is None else (steps, tokens)

    def _loop(self) -> None:
        with http.client(self.api_key, timeout=10.0) as client:
            while not self._stop.is_set():
                snap = fetch_metrics(client, self.url)
                if snap.error:
                    self.error = snap.error
                else:
                    v = snap.get(RUNNING)
                    if v is not None:
                        self.samples.append(v)
                self._stop.wait(self.period)

    def settle(self, expected_tokens: int, timeout: float = 5.0) -> None:
        """Read the counters again once they account for ``expected_tokens``.

        The server records its stats just after answering, so the ``expected_tokens`` the
        responses carried may not be counted yet."""
        if self._base is None:
            return
        deadline = time.monotonic() + timeout
        with http.client(self.api_key, timeout=10.0) as client:
            while True:
                now = self._counters(client)
                if now is not None:
                    self.steps = int(now[0] - self._base[0])
                    self.tokens = int(now[1] - self._base[1])
                    if self.tokens >= expected_tokens:
                        return
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.05)

    def __enter__(self) -> RunningSampler:
        with http.client(self.api_key, timeout=10.0) as client:
            self._base = self._counters(client)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # let the scrape in flight land: on a busy machine one /metrics scrape can outlast
        # a short BS=N phase, and "no sample at all" would hide the evidence we did get
        self._thread.join(timeout=30)


def served_model(url: str, timeout: float = 5.0, *, api_key: str | None = None) -> str | None:
    """The id of the first model the server at ``url`` serves; None when it cannot say."""
    try:
        with http.client(api_key, timeout=timeout) as c:
            data = http.check_auth(c.get(f"{url}/v1/models"), api_key).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(data[0].get("id")) if data and isinstance(data[0], dict) else None


def server_version(url: str, timeout: float = 5.0, *, api_key: str | None = None) -> str | None:
    """The vLLM version the server at ``url`` reports on /version; None when it cannot say."""
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = c.get(f"{url}/version")
            return str(r.json().get("version")) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def completions_refusal(
    url: str, model: str, timeout: float = 60.0, *, api_key: str | None = None
) -> str | None:
    """Why the server refuses /v1/completions for ``model``, or None when it works.

    A pooling model answers 404 or 400. Network errors are left to the real requests, which fail
    closed."""
    body = {"model": model, "prompt": "a", "max_tokens": 1, "temperature": 0.0}
    try:
        with http.client(api_key, timeout=timeout) as c:
            r = c.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError:
        return None
    http.check_auth(r, api_key)
    if r.status_code in (404, 405) or (
        r.status_code == 400 and "support" in r.text.lower() and "completion" in r.text.lower()
    ):
        return f"HTTP {r.status_code}: {r.text[:160]}"
    return None
