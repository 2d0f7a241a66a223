"""`opsctl diag invariance [URL | --model NAME]`: batch invariance (vLLM PR 56528).

Parses the flags into :class:`opsctl.suite.invariance.run.Options` and a target (the URL,
or an engine spec for ``--model``), runs :func:`opsctl.suite.invariance.run.run` (which
owns the isolating engine settings and the comparison), emits the report and maps it to
the exit code: 0 only when every prompt matched, 1 otherwise, 4 when a started engine
did not become healthy within ``--timeout`` (``--mode both``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import (
    seeds_option,
    start_timeout_option,
    url_argument,
    url_or_engine,
)
from opsctl.domain.seeds import seeds_flag
from opsctl.errors import BadInput

if TYPE_CHECKING:
    from opsctl.checks.target import Target
    from opsctl.suite.invariance import run as check


def read_prompts(path: Path | None) -> tuple[str, ...] | None:
    """The prompts of ``--prompts FILE``: a JSON list of strings, or one per non-blank line.

    None without the flag (the check's default prompts)."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read prompts file {path}: {exc}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadInput(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
            raise BadInput(f"{path} must hold a JSON list of strings")
        prompts = [p for p in data if p.strip()]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if len(prompts) < 2:
        raise BadInput(f"{path} holds {len(prompts)} prompt(s); a batch needs at least 2")
    return tuple(prompts)


def _mode(value: str | None) -> str | None:
    """``--mode``: one mode, or a comma list (docs/cli.md); ``default,eager`` is both."""
    if value is None or "," not in value:
        return value
    modes = {m.strip() for m in value.split(",") if m.strip()}
    return "both" if modes == {"default", "eager"} else ",".join(sorted(modes))


def flags(
    api_key: str | None = None,  # the shared --api-key and --test-knob: the skeleton
    test_knob: list[str] | None = None,  # adds them after the check's own flags
    url: str = url_argument(),
    model: str = typer.Option(
        None, "--model", help="start this embedded model / model dir (default tiny-llama)"
    ),
    prompts_file: Path = typer.Option(
        None, "--prompts", metavar="FILE", help="prompts: JSON list or one per line"
    ),
    batch_size: int = typer.Option(None, "--batch-size", help="N for BS=N (default: prompts)"),
    max_tokens: int = typer.Option(16, "--max-tokens", help="tokens generated per prompt"),
    logprobs: int = typer.Option(5, "--logprobs", help="top logprobs compared per position"),
    mode: str = typer.Option(
        None,
        "--mode",
        metavar="MODE",
        help="engines to start: default, eager or both (a comma list of default,eager)",
    ),
    atol: float = typer.Option(None, "--atol", help="logprob tolerance (default: bitwise)"),
    batch_via: str = typer.Option(
        None,
        "--batch-via",
        help="BS=N as one request with N prompts (list; text default) or N concurrent "
        "requests (requests; the only way with images)",
    ),
    images: int = typer.Option(
        None,
        "--images",
        help="most images per prompt on a vision-language model (default: the model's; "
        "0: text only)",
    ),
    seeds: str = seeds_option(),
    timeout: float = start_timeout_option(),
) -> tuple[Target, check.Options]:
    """BS=1 vs BS=N batch invariance of tokens and logprobs (exit 0 only if all match)."""
    from opsctl.suite.invariance import run as check

    swept = seeds_flag(seeds)
    if swept and prompts_file is not None:
        raise BadInput("--seeds makes one prompt set per seed; it does not take --prompts")
    target = url_or_engine(url, model, api_key, timeout, test_knob)
    options = check.Options(
        read_prompts(prompts_file) or check.DEFAULT_PROMPTS,
        batch_size,
        max_tokens,
        logprobs,
        _mode(mode),
        atol,
        batch_via,
        timeout,
        images=images,
        seeds=swept,
    )
    check.plan(target, options)  # bad input is refused before any engine or panel
    return target, options
