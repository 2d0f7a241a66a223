"""`opsctl diag lora [URL | --model NAME]`: LoRA adapters alone and in one mixed batch
(vLLM PR 55897). Parses the flags into :class:`opsctl.checks.lora.Options` and a target,
runs :func:`opsctl.checks.lora.run`, prints the report and maps it to the exit code:
0 pass (or unverified, with a warning), 1 fail, 2 bad input (e.g. an adapter directory
that does not exist), 3 unreachable, 4 timeout."""

from __future__ import annotations

from typing import Any

import typer

from opsctl.commands.options import (
    api_key_option,
    epilog,
    json_option,
    start_timeout_option,
    test_knob_option,
    tui_option,
    url_argument,
    url_target,
)
from opsctl.errors import CheckFailed

VERDICT = {"pass": "[green]PASS[/]", "fail": "[red]FAIL[/]", "unverified": "[yellow]UNVERIFIED[/]"}
STATUS = {"applied": "green", "supported": "green", "unsupported": "red", "not enabled": "yellow"}


def render(con, doc: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    engine = doc["engine"] or {}
    con.print(
        f"diag lora: {VERDICT.get(doc['verdict'], doc['verdict'])}  model {doc['model']}  "
        f"platform {doc['platform'] or 'unknown (' + str(doc.get('platform_note')) + ')'}  vLLM {doc['vllm_version'] or '?'}  "
        f"compilation {engine.get('compilation_mode', '?')}  ({doc['comparison']})"
    )
    parts = Table(title="LoRA support per part (engine record + measurement)")
    for col in ("part", "status", "wrapped", "why"):
        parts.add_column(col)
    for p in doc["support"]:
        style = STATUS.get(p["status"], "yellow")
        wrapped = "?" if p["wrapped_modules"] is None else str(p["wrapped_modules"])
        parts.add_row(p["part"], f"[{style}]{p['status']}[/]", wrapped, escape(p["detail"]))
    con.print(parts)
    cases = Table(title="cases")
    for col in ("case", "adapter", "verdict", "detail"):
        cases.add_column(col)
    for s in doc["single"]:
        cases.add_row("single", s["adapter"], VERDICT.get(s["verdict"]), escape(s["detail"]))
    mixed, batch = doc["mixed"], doc["mixed"]["batch"]
    first = mixed["first_divergence"]
    detail = (
        f"first divergence r{first['request']} ({first['adapter']}, images "
        f"{'+'.join(first['images']) or '-'}): {first['text']}"
        if first
        else f"{len(mixed['requests'])} requests equal their alone runs"
    )
    detail += f"; batch: {batch['max_adapters_per_step']} adapters/step ({batch['source']})"
    if enc := mixed["encoder"]:
        detail += f"; vision encoder: {enc['max_adapters_per_step']} adapters/call"
    if first and first.get("looks_like"):
        detail += f"; r{first['request']} got {first['looks_like']}'s output"
    cases.add_row("mixed", "all", VERDICT.get(mixed["verdict"]), escape(detail))
    con.print(cases)
    for line in doc["reasons"]:
        con.print(f"[red]reason:[/] {escape(line)}")


def lora(
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
    timeout: float = start_timeout_option(),
    as_json: bool = json_option(),
    tui: bool | None = tui_option(),
    api_key: str | None = api_key_option(),
    test_knob: list[str] | None = test_knob_option(),
) -> None:
    """LoRA adapters alone and in one mixed batch (exit 0 pass, 1 fail)."""
    from opsctl import output
    from opsctl.checks import lora as check
    from opsctl.checks.target import EngineSpec, Target, url_or_model
    from opsctl.commands.options import parse_knobs
    from opsctl.ui.progress import run_with_progress

    base = url_or_model(url, model)
    options = check.Options(
        adapters=tuple(adapters or ()),
        max_tokens=max_tokens,
        logprobs=logprobs,
        atol=atol,
        images=images,
        timeout=timeout,
        max_loras=max_loras,
    )
    knobs = parse_knobs(test_knob, url=base)
    target: Target = (
        url_target(base, api_key, timeout)
        if base
        else EngineSpec(model, knobs=tuple(knobs.items()))
    )
    check.plan(target, options)  # bad input is refused before any engine or panel
    report = run_with_progress(
        check.TITLE, lambda progress: check.run(target, options, progress), tui=tui, as_json=as_json
    )
    for line in report.warnings:
        output.warn(line)
    doc = report.to_dict()
    output.emit(doc, as_json=as_json, render=lambda con: render(con, doc))
    if not report.passed:
        raise CheckFailed("diag lora failed: " + "; ".join(report.reasons or ["see report"])[:600])


def register(app: typer.Typer) -> None:
    app.command(
        "lora",
        short_help="LoRA adapters alone and in one mixed batch.",
        epilog=epilog(
            "opsctl diag lora --model tiny-llama",
            "opsctl diag lora --model tiny-vlm-multi --max-loras 3 --json",
            "opsctl diag lora 127.0.0.1:8000 --adapters ./a1 --adapters ./a2",
        ),
    )(lora)
