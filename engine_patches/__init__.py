"""opsctl's vLLM general plugin.

Registered through the ``vllm.general_plugins`` entry point, so vLLM calls
:func:`register` in every process it starts (API server, EngineCore, workers),
possibly more than once. It is inert unless ``OPSCTL_RUN_DIR`` is set (opsctl sets it
for engines it starts), so installing opsctl never changes other vLLM deployments.

In each process it first writes down from then on the shared-memory segments the process
makes (``engine_patches.run_segments.record_made``: whoever removes the run last finds
them), starts the owner watchdog (``engine_patches.watchdog``: the process stops itself
when the opsctl process that started the engine is gone), then applies the patches
(``engine_patches.registry``).

This package must never import opsctl.ui, textual or typer: it runs inside vLLM.
"""

from __future__ import annotations

import os

_FORK_HOOK_IN: int | None = None  # pid of the process that armed the after-fork hook


def _after_fork_in_child() -> None:
    """A process vLLM forks (the EngineCore, with ``engine_patches.patches.engine_core_fork``)
    inherits ``vllm.plugins.plugins_loaded``: clear it so vLLM loads the plugins again
    where a spawned process would, and :func:`register` runs there under its own role."""
    import sys

    plugins = sys.modules.get("vllm.plugins")
    if plugins is not None and getattr(plugins, "plugins_loaded", False):
        plugins.plugins_loaded = False  # type: ignore[attr-defined]


def register() -> None:
    """Start the owner watchdog and apply the patches in this vLLM process (inert without a run)."""
    global _FORK_HOOK_IN
    if not os.environ.get("OPSCTL_RUN_DIR"):
        return
    if _FORK_HOOK_IN is None:
        _FORK_HOOK_IN = os.getpid()
        os.register_at_fork(after_in_child=_after_fork_in_child)
    try:
        from engine_patches import run_segments, watchdog
        from engine_patches.registry import process_role, record_event

        role = process_role()
        run_segments.record_made()  # what its run made, for whoever removes it last
        if watchdog.start(role) and not watchdog.recorded():
            record_event(
                "lifetime", {"event": "owner_watch", "role": role, "owner": watchdog.watching()}
            )
    except Exception as exc:  # never take the engine down
        import sys

        print(f"[opsctl] owner watchdog failed: {exc!r}", file=sys.stderr)
    try:
        from engine_patches.registry import apply_all

        apply_all()
    except Exception as exc:  # a failing plugin must never take the engine down
        import sys

        print(f"[opsctl] engine_patches failed: {exc!r}", file=sys.stderr)
