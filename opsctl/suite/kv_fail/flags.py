"""`opsctl diag kv-fail`: KV load failures on a live engine (vLLM PR 50388).

Parses the flags into an engine spec (model, ``--no-patch`` as a disabled patch, test
knobs, start timeout) and :class:`opsctl.suite.kv_fail.run.Options`, runs
:func:`opsctl.suite.kv_fail.run.run` (its docstring describes the four phases) and emits
its report.

``--seeds 0-9`` (or ``1,3,5``) sweeps seeds on one engine start while the engine lives
(a seed that kills it is recorded, the next gets a fresh engine): per-seed rows and totals.

Reports vLLM version and platform, KV cache groups, failures injected, requests
affected, tokens recomputed (vLLM's own "tokens affected" log lines), requests failed,
engine alive, per-request equality, verdict. Exit 0 when the engine survived and every
non-failed output equals its baseline (every seed); 1 otherwise (also inconclusive: the
comparison could not tell a missed recovery from the engine's own noise) (``--no-patch`` on a hybrid model
shows the engine death the patch prevents); 2 for bad arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from opsctl.commands.options import duration_option, seeds_option
from opsctl.domain.seeds import seeds_flag
from opsctl.errors import BadInput

if TYPE_CHECKING:
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.kv_fail import run as check

_ROUTE = typer.Option(
    "blocks",
    "--route",
    help="how the connector reports a failed load: blocks (failed block ids, synchronous "
    "loads) | requests (failed requests, asynchronous loads; vLLM 0.30+)",
)
_MODE = typer.Option(
    "eager",
    "--mode",
    help="the engine's execution mode: eager (--enforce-eager) | default (vLLM's own: "
    "torch.compile and CUDA graphs on a GPU)",
)


def _spec(model, no_patch, mode, timeout, memory=None, kv_bytes=None):
    """The engine the check starts: --no-patch turns every KV recovery patch off,
    --mode picks eager or vLLM's default execution mode (anything else is exit 2)."""
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.kv_fail import run as check

    if mode not in ("eager", "default"):
        raise BadInput(f"--mode must be eager or default, not {mode!r}")
    if memory is not None and not 0.0 < memory <= 1.0:
        raise BadInput(f"--gpu-memory-utilization must be in (0, 1], not {memory}")
    disabled = check.NO_PATCH if no_patch else ()
    if kv_bytes is not None and kv_bytes <= 0:
        raise BadInput(f"--kv-cache-memory-bytes must be positive, not {kv_bytes}")
    extra = () if memory is None else ("--gpu-memory-utilization", str(memory))
    extra += () if kv_bytes is None else ("--kv-cache-memory-bytes", str(kv_bytes))
    return EngineSpec(
        model=model,
        disable_patches=disabled,
        timeout=timeout,
        enforce_eager=mode == "eager",
        extra_args=extra,
    )


def _seeds(seed: int | None, seeds: str | None) -> tuple[int, ...]:
    """The sweep's seeds (empty: --seed alone); bad or both flags exit 2."""
    if seeds is not None and seed is not None:
        raise BadInput("give either --seed or --seeds, not both")
    return seeds_flag(seeds)


def flags(
    model: str = typer.Option(
        "tiny-hybrid", "--model", help="tiny-llama | tiny-hybrid | model dir"
    ),
    policy: str = typer.Option(
        "recompute", "--policy", help="kv_load_failure_policy: recompute | fail"
    ),
    rate: float = typer.Option(
        None, "--rate", help="fail each loaded block with probability R (0..1)"
    ),
    blocks: str = typer.Option(
        None,
        "--blocks",
        help="fail block positions: POS or GROUP:POS, comma-separated "
        "(negative from the end; default -1 = last loaded block of every group)",
    ),
    requests: int = typer.Option(4, "--requests", help="requests in the workload"),
    seed: int = typer.Option(
        None, "--seed", help="seed of prompts, targets and rate draws  [default: 0]"
    ),
    seeds: str = seeds_option(
        "a sweep on one engine: every seed in N-M or a comma list (0-9, 1,3,5), "
        "reported per seed and in total"
    ),
    fail_requests: int = typer.Option(
        None,
        "--fail-requests",
        metavar="N",
        help="how many requests get injections (default: half; with --rate: all)",
    ),
    max_tokens: int = typer.Option(16, "--max-tokens", help="tokens generated per request"),
    no_patch: bool = typer.Option(
        False,
        "--no-patch",
        help="run vanilla vLLM (opsctl's KV recovery patches off: kv_hybrid_recompute, "
        "kv_async_inflight, kv_rewind_v2)",
    ),
    route: str = _ROUTE,
    mode: str = _MODE,
    gpu_memory: float = typer.Option(
        None,
        "--gpu-memory-utilization",
        metavar="FRACTION",
        help="share of the GPU's memory the engine may take (vLLM's flag; several engines "
        "on one GPU need a small one, e.g. 0.08)",
    ),
    kv_bytes: int = typer.Option(
        None,
        "--kv-cache-memory-bytes",
        metavar="BYTES",
        help="the engine's KV cache size (vLLM's flag: skips its memory profiling, which "
        "fails when another engine on the GPU frees memory meanwhile)",
    ),
    timeout: float = duration_option(
        "10m", "--timeout", help="the longest wait for the engine to start (exit 4 past it)"
    ),
    test_knob: list[str] | None = None,
) -> tuple[EngineSpec, check.Options]:
    """Inject KV load failures and prove recovery (exit 0: engine alive, outputs equal)."""
    from dataclasses import replace

    from opsctl.commands.options import parse_knobs
    from opsctl.suite.kv_fail import run as check
    from opsctl.suite.kv_fail.judge import Settings

    sweep = _seeds(seed, seeds)
    first = sweep[0] if sweep else seed or 0
    settings = Settings(policy, rate, blocks, requests, first, fail_requests, max_tokens, route)
    options = check.Options(settings, seeds=sweep)
    spec = _spec(model, no_patch, mode, timeout, gpu_memory, kv_bytes)
    check.validate(spec, options)  # bad flags exit 2 before any knob is looked at
    return replace(spec, knobs=tuple(sorted(parse_knobs(test_knob).items()))), options
