"""One completion as a server returned it, and the request ids opsctl gives its prompts.

Shared by the completions collector (which sends the requests and parses the answers)
and the checks that compare generations (invariance, lora, mm-uuid). A request for one
prompt is ``<tag>-p<i>-<hex8>``; one request carrying a group of prompts is
``<tag>-g<start>-<hex8>``, and the engine names its prompts ``...-<hex8>-<i>-...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TokenKey = int | str  # a token id, or the token string when the server gave no ids


@dataclass(frozen=True, slots=True)
class Generated:
    """One completion as the server returned it (already parsed, not yet validated)."""

    token_ids: tuple[TokenKey, ...] = ()
    logprobs: tuple[float | None, ...] = ()
    top_logprobs: tuple[dict[TokenKey, float] | None, ...] = ()
    finish_reason: str | None = None
    outputs: int = 1  # number of choices the server returned
    error: str | None = None  # request error (HTTP status, exception, bad JSON)
    has_logprobs: bool = True  # the response carried a logprobs object at all
    prompt_tokens: int | None = None  # usage.prompt_tokens (chat requests with images)


def prompt_index(req_id: str, tag: str) -> int | None:
    """Which prompt an engine request id belongs to, or None (not one of ``tag``'s)."""
    m = re.search(re.escape(tag) + r"-g(\d+)-[0-9a-f]{8}-(\d+)", req_id)
    if m:
        return int(m[1]) + int(m[2])
    m = re.search(re.escape(tag) + r"-p(\d+)-", req_id)
    return int(m[1]) if m else None
