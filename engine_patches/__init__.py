"""opsctl's vLLM general plugin.

Registered through the ``vllm.general_plugins`` entry point, so vLLM calls
:func:`register` in every process it starts (API server, EngineCore, workers),
possibly more than once. It is inert unless ``OPSCTL_RUN_DIR`` is set (opsctl sets it
for engines it starts), so installing opsctl never changes other vLLM deployments.

This package must never import opsctl.ui, textual or typer: it runs inside vLLM.
"""

from __future__ import annotations

import os


def register() -> None:
    if not os.environ.get("OPSCTL_RUN_DIR"):
        return
    try:
        from engine_patches.registry import apply_all

        apply_all()
    except Exception as exc:  # a failing plugin must never take the engine down
        import sys

        print(f"[opsctl] engine_patches failed: {exc!r}", file=sys.stderr)
