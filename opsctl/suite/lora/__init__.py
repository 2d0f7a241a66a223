"""lora: LoRA adapters alone and in one mixed batch (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a
surface needs it): ``judge.py`` and ``judge_support.py`` (pure: the cases' verdicts, what
this vLLM supports), ``collect.py`` (adapter directories, requests, the engine's
records), ``run.py`` and ``run_plan.py`` (the library call and the engine it plans),
``flags.py`` (``opsctl diag lora``'s flags), ``view.py`` (the text renderer). A diag
only: certify and the console do not run it.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check

CHECK = Check(
    "lora",
    "LoRA adapters alone and in one mixed batch",
    "LoRA adapters alone and in one mixed batch.",
    order=80,
    examples=(
        "opsctl diag lora --model tiny-llama",
        "opsctl diag lora --model tiny-vlm-multi --max-loras 3 --json",
        "opsctl diag lora 127.0.0.1:8000 --adapters ./a1 --adapters ./a2",
    ),
)
