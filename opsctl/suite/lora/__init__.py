"""lora: LoRA adapters alone and in one mixed batch (the check's declaration).

Its code: the run opsctl.checks.lora (and lora_plan), its flags opsctl.commands.diag.lora,
its judgement opsctl.domain.lora and lora_support, its I/O opsctl.collectors.lora, its
renderer opsctl.ui.render_lora. A diag only: certify and the console do not run it.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Parts


def _flags():
    from opsctl.commands.diag.lora import lora

    return lora


def _load() -> Parts:
    from opsctl.checks import lora
    from opsctl.ui.render_lora import render

    return Parts.of(lora, report=lora.LoraReport, render=render)


CHECK = Check(
    "lora",
    "LoRA adapters alone and in one mixed batch",
    "LoRA adapters alone and in one mixed batch.",
    order=80,
    load=_load,
    flags=_flags,
    examples=(
        "opsctl diag lora --model tiny-llama",
        "opsctl diag lora --model tiny-vlm-multi --max-loras 3 --json",
        "opsctl diag lora 127.0.0.1:8000 --adapters ./a1 --adapters ./a2",
    ),
)
