"""`opsctl diag lora [URL | --model NAME]`: LoRA adapters alone and in one mixed batch.

vLLM PR 55897. Parses the flags into :class:`opsctl.suite.lora.run.Options` and a target,
runs :func:`opsctl.suite.lora.run.run`, prints the report and maps it to the exit code:
0 pass; 1 fail, unverified or inconclusive (not judged is never a pass); 2 bad input (e.g. an adapter directory
that does not exist), 3 unreachable, 4 timeout."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import (
    seeds_option,
    start_timeout_option,
    url_argument,
    url_or_engine,
)
from opsctl.domain.seeds import seeds_flag

if TYPE_CHECKING:
    from opsctl.checks.target import Target
    from opsctl.suite.lora import run as check


def flags(
    url: str = url_argument(),
    model: str = typer.Option(
        None, "--model", help="start this embedded model / model dir (default tiny-llama)"
    ),
    adapters: list[str] | None = typer.Option(
        None,
        "--adapters",
        metavar="DIR",
        help="PEFT adapter directory (repeatable; default: embedded)",
    ),
    max_tokens: int = typer.Option(32, "--max-tokens", help="tokens generated per request"),
    logprobs: int = typer.Option(5, "--logprobs", help="top logprobs compared per position"),
    atol: float = typer.Option(None, "--atol", help="logprob tolerance (default: bitwise)"),
    images: int = typer.Option(None, "--images", help="images per request (default: by model)"),
    max_loras: int = typer.Option(
        None, "--max-loras", help="LoRA slots of the started engine (default: one per adapter)"
    ),
    seeds: str = seeds_option(),
    timeout: float = start_timeout_option(),
    api_key: str | None = None,
    test_knob: list[str] | None = None,
) -> tuple[Target, check.Options]:
    """LoRA adapters alone and in one mixed batch (exit 0 pass, 1 fail or not judged)."""
    from opsctl.suite.lora import run as check

    swept = seeds_flag(seeds)

    options = check.Options(
        adapters=tuple(adapters or ()),
        max_tokens=max_tokens,
        logprobs=logprobs,
        atol=atol,
        images=images,
        timeout=timeout,
        max_loras=max_loras,
        seeds=swept,
    )
    target = url_or_engine(url, model, api_key, timeout, test_knob)
    check.plan(target, options)  # bad input is refused before any engine or panel
    return target, options
