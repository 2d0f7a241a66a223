"""`opsctl diag usage`: /score and /rerank ``usage`` against a count of the engine inputs.

An independent count; the check itself: opsctl.suite.usage.run.

Exit 1 on any mismatch, 2 for bad input or a generative model, 3 unreachable, 4 when the
server does not answer within --timeout; verdict "unverified" (the expected count cannot
be derived) is exit 0 with a warning on stderr, never a mismatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from opsctl.checks.target import url_target
from opsctl.commands.options import duration_option, url_argument
from opsctl.domain.weights import LOAD_FORMAT_HELP, check_load_format
from opsctl.errors import BadInput

if TYPE_CHECKING:
    from opsctl.checks.target import Target
    from opsctl.suite.usage import run as check


def flags(
    url: str | None = url_argument(),
    model: str | None = typer.Option(
        None, "--model", help="start this model (embedded name or directory)"
    ),
    kind: str | None = typer.Option(
        None, "--kind", help="cross-encoder | bi-encoder (default: detect)"
    ),
    load_format: str = typer.Option("auto", "--load-format", help=LOAD_FORMAT_HELP),
    timeout: float = duration_option(
        "60s", "--timeout", help="the longest wait for each HTTP answer (exit 4 past it)"
    ),
    api_key: str | None = None,
    test_knob: list[str] | None = None,
) -> tuple[Target, check.Options]:
    """Check /score and /rerank usage.prompt_tokens against the engine inputs.

    Exit 1 on a mismatch; verdict "unverified" (exit 0, warning) when the expected
    count cannot be derived."""
    from opsctl.checks.target import EngineSpec, url_or_model
    from opsctl.commands.options import parse_knobs
    from opsctl.suite.usage import run as check
    from opsctl.suite.usage.judge import KINDS

    if kind is not None and kind not in KINDS:
        raise BadInput(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    check_load_format(load_format)
    if not url and not model:
        raise BadInput(
            "give a server URL or --model NAME",
            hint="e.g. opsctl diag usage --model tiny-reranker",
        )
    url = url_or_model(url, model)
    knobs = parse_knobs(test_knob, url=url)
    if url:
        return url_target(url, api_key, timeout), check.Options(kind, timeout)
    spec = EngineSpec(model=model, load_format=load_format, knobs=tuple(knobs.items()))
    return spec, check.Options(kind, timeout)
