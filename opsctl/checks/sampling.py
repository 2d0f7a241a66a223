"""The sampling flags shared by the diags that compare tokens and logprobs."""

from __future__ import annotations

from opsctl.errors import BadInput


def check_sampling(max_tokens: int, logprobs: int, atol: float | None) -> None:
    """Refuse (BadInput) a --max-tokens, --logprobs or --atol no comparison can use."""
    if max_tokens < 1:
        raise BadInput("--max-tokens must be at least 1")
    if logprobs < 0:
        raise BadInput("--logprobs must be 0 or more")
    if atol is not None and not (atol >= 0 and atol != float("inf")):
        raise BadInput("--atol must be a finite number >= 0")
