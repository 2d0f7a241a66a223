"""I/O for ``opsctl diag usage``: the scoring endpoints and the local token counts.

The token counts are what the check compares the endpoints' ``usage`` with.

- :class:`ScoringApi`: /v1/models, /score, /rerank, /tokenize and endpoint probes of one
  server, with its API key (opsctl.collectors.http). A 401/403 is "authentication
  required" (exit 3), no answer within ``timeout`` is :class:`~opsctl.errors.OpsTimeout`
  (exit 4), a failed connection :class:`~opsctl.errors.EngineUnreachable`.
- :func:`load_tokenizer` / :func:`local_counts`: the model's own tokenizer when its
  directory is readable here, called exactly as vLLM's scoring io_processor calls it.
- :func:`config_of`: the model directory's config.json (to tell the model kind).

Which texts to count, and how counts become an expected number, is opsctl.suite.usage.judge.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from opsctl.collectors import http
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsTimeout


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The model a server serves: the id requests name and its directory there."""

    name: str  # the id requests must name
    root: str | None  # the model directory as the server sees it


class ScoringApi:
    """The few HTTP calls diag usage makes (I/O only); use as a context manager."""

    def __init__(self, url: str, timeout: float = 60.0, api_key: str | None = None) -> None:
        self.url, self.timeout, self.api_key = url, timeout, api_key
        self.client = http.client(api_key, timeout=timeout)
        self.model = ""

    def __enter__(self) -> ScoringApi:
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def _post(self, path: str, body: dict) -> httpx.Response:
        try:
            return http.check_auth(self.client.post(f"{self.url}{path}", json=body), self.api_key)
        except httpx.TimeoutException:
            raise OpsTimeout(
                f"POST {path} to {self.url} got no answer within {self.timeout:g} s",
                hint="raise --timeout if the server is just slow",
            ) from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"POST {path} to {self.url} failed: {type(exc).__name__}: {exc}"
            ) from None

    def served_model(self) -> ServedModel:
        """The model the server serves (``GET /v1/models``)."""
        try:
            r = http.check_auth(self.client.get(f"{self.url}/v1/models"), self.api_key)
        except httpx.TimeoutException:
            raise OpsTimeout(
                f"GET /v1/models at {self.url} got no answer within {self.timeout:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"GET /v1/models at {self.url} failed: {type(exc).__name__}"
            ) from None
        if r.status_code != 200:
            raise BadInput(
                f"{self.url}/v1/models answered HTTP {r.status_code}; is this a vLLM server?"
            )
        try:
            data = r.json()["data"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BadInput(f"{self.url}/v1/models returned no model") from None
        self.model = str(data.get("id"))
        return ServedModel(self.model, data.get("root"))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> tuple[str, ...]:
        """The token strings /tokenize gives for ``text``."""
        body = {
            "model": self.model,
            "prompt": text,
            "add_special_tokens": add_special_tokens,
            "return_token_strs": True,
        }
        r = self._post("/tokenize", body)
        if r.status_code != 200:
            raise CheckFailed(f"/tokenize answered HTTP {r.status_code}: {r.text[:200]}")
        payload = r.json()
        strs = payload.get("token_strs") or [str(t) for t in payload.get("tokens", [])]
        if len(strs) != len(payload.get("tokens", strs)):
            raise CheckFailed("/tokenize returned token_strs and tokens of different lengths")
        return tuple(strs)

    def token_lengths(self, requests: Iterable[tuple[str, bool]]) -> dict[tuple[str, bool], int]:
        """{(text, add_special_tokens): number of tokens} from /tokenize."""
        return {(text, special): len(self.tokenize(text, special)) for text, special in requests}

    def call(self, endpoint: str, body: dict) -> tuple[int, dict[str, Any]]:
        """POST /``endpoint``: (HTTP status, JSON payload; ``{"raw": ...}`` if not a dict)."""
        r = self._post(f"/{endpoint}", body)
        try:
            payload = r.json()
        except ValueError:
            payload = {"raw": r.text[:300]}
        return r.status_code, payload if isinstance(payload, dict) else {"raw": payload}

    def answers(self, path: str, body: dict) -> bool:
        """Whether a probe request to ``path`` is answered with 200."""
        return self._post(path, body).status_code == 200


def config_of(root: str | None) -> dict | None:
    """The model directory's config.json when it is readable here, else None."""
    if not root:
        return None
    try:
        config = json.loads((Path(root) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def load_tokenizer(path: str | None) -> Any | None:
    """The model's own tokenizer when its directory is readable here; None otherwise.

    Its directory, or a local HF cache; loaded as vLLM loads it (AutoTokenizer)."""
    if not path:
        return None
    p = Path(path)
    if (
        p.exists()
        and not (p / "tokenizer_config.json").is_file()
        and not (p / "tokenizer.json").is_file()
    ):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # not readable here: /tokenize stays the source
        return None


def local_counts(tokenizer: Any, inputs: Sequence[str | tuple[str, str]]) -> tuple[int, ...]:
    """Each engine input's length, exactly as vLLM tokenizes it.

    Scoring io_processor: ``tokenizer(text=q, text_pair=d)`` for a pair; one text with its
    special tokens."""
    out = []
    for x in inputs:
        if isinstance(x, tuple):
            out.append(len(tokenizer(text=x[0], text_pair=x[1])["input_ids"]))
        else:
            out.append(len(tokenizer(x)["input_ids"]))
    return tuple(out)
