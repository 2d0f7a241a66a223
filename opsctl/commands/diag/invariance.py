"""`opsctl diag invariance [URL | --model NAME]`: batch invariance (vLLM PR 56528).

Runs every prompt alone (BS=1) and all prompts together (BS=N, sent at once so the
engine batches them) and compares tokens and logprobs, bitwise unless ``--atol``.
Fails closed (request errors, missing logprobs, short outputs are failures). When opsctl
starts the engine it applies the isolating settings (prefix caching off, mm processor
cache 0, VLLM_USE_FLASHINFER_SAMPLER=0; greedy + ignore_eos per request) and reads them
back from the engine (engine_info and batch probes); against an external URL it says
which it could not enforce. Exit 0 only when every prompt matched.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import typer

from opsctl.commands.options import api_key_option, test_knob_option
from opsctl.errors import BadInput, CheckFailed, OpsTimeout

MODES = ("default", "eager", "both")
BATCH_VIA = ("list", "requests")
DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog",
    "Hello world, this is a test of",
    "Once upon a time there was",
    "vLLM serves large language models",
    "The cat sat on the mat and",
    "In the beginning the engine",
    "Numbers: one two three four",
    "A batch of prompts walks into a",
)
ISOLATING_ARGS = ["--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"]
ISOLATING_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
SCHEMA = "diag.invariance"


def read_prompts(path: Path | None) -> list[str]:
    """``--prompts FILE``: a JSON list of strings, or one prompt per non-blank line."""
    if path is None:
        return list(DEFAULT_PROMPTS)
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
    return prompts


def plan_modes(url: str | None, mode: str | None) -> list[str | None]:
    """Which runs to do. URL: one run on the server as it is (mode only checked)."""
    if mode is not None and mode not in MODES:
        raise BadInput(f"--mode must be one of {', '.join(MODES)}, not {mode!r}")
    if url:
        if mode == "both":
            raise BadInput("--mode both needs opsctl to start the engine (use --model, not a URL)")
        return [mode]
    if mode == "both":
        return ["default", "eager"]
    return [mode or "default"]


def validate_options(
    batch_size: int | None, max_tokens: int, logprobs: int, atol: float | None, n_prompts: int
) -> int:
    if max_tokens < 1:
        raise BadInput("--max-tokens must be at least 1")
    if logprobs < 0:
        raise BadInput("--logprobs must be 0 or more")
    if atol is not None and not (atol >= 0 and atol != float("inf")):
        raise BadInput("--atol must be a finite number >= 0")
    n = n_prompts if batch_size is None else batch_size
    if n < 2:
        raise BadInput("--batch-size must be at least 2 (BS=N is compared with BS=1)")
    if n > n_prompts:
        raise BadInput(f"--batch-size {n} is larger than the number of prompts ({n_prompts})")
    return n


GENERATIVE = ("decoder", "hybrid-decoder", "vision-language")


def require_generative(model: str | None) -> None:
    """Refuse pooling models before an engine is started (exit 2)."""
    from opsctl.engine.model import resolve

    resolved = resolve(model or "tiny-llama")
    if resolved.archetype not in GENERATIVE:
        raise BadInput(
            f"{resolved.name} is a {resolved.archetype} model; diag invariance needs a "
            "generative model (e.g. tiny-llama)"
        )


def register(app: typer.Typer) -> None:
    @app.command("invariance")
    def invariance(
        url: str = typer.Argument(None, help="base URL of a running vLLM server (else --model)"),
        model: str = typer.Option(
            None, "--model", help="start this embedded model / model dir (default tiny-llama)"
        ),
        prompts_file: Path = typer.Option(
            None, "--prompts", help="prompts: JSON list or one per line"
        ),
        batch_size: int = typer.Option(
            None, "--batch-size", help="N for BS=N (default: number of prompts)"
        ),
        max_tokens: int = typer.Option(16, "--max-tokens", help="tokens generated per prompt"),
        logprobs: int = typer.Option(5, "--logprobs", help="top logprobs compared per position"),
        mode: str = typer.Option(None, "--mode", help="default | eager | both (started engines)"),
        atol: float = typer.Option(None, "--atol", help="logprob tolerance (default: bitwise)"),
        batch_via: str = typer.Option(
            "list",
            "--batch-via",
            help="BS=N as one request with N prompts (list) or N concurrent requests",
        ),
        timeout: float = typer.Option(
            600.0, "--timeout", help="seconds to wait for a started engine"
        ),
        as_json: bool = typer.Option(False, "--json"),
        tui: bool = typer.Option(False, "--tui", help="live progress and divergences"),
        api_key: str | None = api_key_option(),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """BS=1 vs BS=N batch invariance of tokens and logprobs (exit 0 only if all match)."""
        from opsctl import output
        from opsctl.commands.diag.common import (
            add_knob_warnings,
            check_url,
            run_pipeline,
            warn_test_knobs,
        )
        from opsctl.commands.diag.invariance_run import Request, render, run_all
        from opsctl.commands.options import parse_knobs

        if url and model:
            raise BadInput("give either a URL or --model, not both")
        base = check_url(url) if url else None
        if not base:
            require_generative(model)
        modes = plan_modes(base, mode)
        prompts = read_prompts(prompts_file)
        n = validate_options(batch_size, max_tokens, logprobs, atol, len(prompts))
        if timeout <= 0:
            raise BadInput("--timeout must be positive")
        if batch_via not in BATCH_VIA:
            raise BadInput(f"--batch-via must be one of {', '.join(BATCH_VIA)}, not {batch_via!r}")
        knobs = parse_knobs(test_knob, url=base)
        req = Request(
            base,
            model,
            prompts,
            n,
            max_tokens,
            logprobs,
            atol,
            modes,
            timeout,
            tag=f"opsctl-inv-{uuid.uuid4().hex[:6]}",
            batch_via=batch_via,
            api_key=api_key,
            knobs=knobs,
        )
        started = time.time()
        report = run_pipeline(
            "diag invariance", lambda emit: run_all(req, emit), tui=tui, as_json=as_json
        )
        report["seconds"] = round(time.time() - started, 2)
        doc = add_knob_warnings(
            output.document(SCHEMA, **report), [r.get("run_dir") for r in report["runs"]]
        )
        warn_test_knobs(doc)
        output.emit(doc, as_json=as_json, render=lambda con: render(con, doc))
        if any(r.get("timed_out") for r in report["runs"]):
            raise OpsTimeout("an engine did not become healthy within --timeout; see the report")
        if report["verdict"] != "pass":
            raise CheckFailed(
                "batch invariance failed: "
                + "; ".join(report.get("reasons") or ["see report"])[:600],
                hint="--atol X allows a stated logprob tolerance"
                if report.get("atol") is None
                else None,
            )
