"""Test-only knobs that alter an engine on purpose, honoured only when opsctl set them.

Test-only knobs: environment variables that change what an engine does on purpose
(plant a logit nudge, rewrite a multimodal identifier, switch the owner watchdog off).

They are never taken from an inherited environment. opsctl strips every name in
``KNOBS`` (and ``ENABLE``) from the environment it passes to an engine, and sets them
again only for knobs a caller asked for explicitly (``LaunchOptions.knobs``); then it
also sets ``ENABLE=1``. Inside the engine a knob is honoured only when ``ENABLE`` is
"1", so a stray ``export OPSCTL_PROBE_NUDGE=...`` in an operator's shell changes
nothing. The ledger records the knobs active in each process (``active()``).

Pure module: imports neither vLLM nor anything of opsctl's I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE = "OPSCTL_TEST_KNOBS"
NUDGE = "OPSCTL_PROBE_NUDGE"
MM_UUID_REWRITE = "OPSCTL_MM_UUID_REWRITE"
NO_OWNER_WATCH = "OPSCTL_TEST_NO_OWNER_WATCH"
LORA_SWAP = "OPSCTL_LORA_SWAP"
HANG_STEP = "OPSCTL_HANG_STEP"  # a file: while it exists the EngineCore's step blocks
HANG_GPU = "OPSCTL_HANG_GPU"  # a file: while it exists the model step spins the GPU
# RANK:FILE (``TP1:/tmp/hold``): while FILE exists that rank blocks before its first
# collective in the model's forward, its peers wait in the collective
HANG_RANK = "OPSCTL_HANG_RANK"
KNOBS = (NUDGE, MM_UUID_REWRITE, NO_OWNER_WATCH, LORA_SWAP, HANG_STEP, HANG_GPU, HANG_RANK)


def active(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The knobs this process honours: none unless ``ENABLE`` is "1"."""
    env = os.environ if env is None else env
    if env.get(ENABLE) != "1":
        return {}
    return {k: env[k] for k in KNOBS if env.get(k)}


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """One knob's value, or None when it is unset or knobs are not enabled."""
    return active(env).get(name)


def scrub(env: dict[str, str]) -> dict[str, str]:
    """``env`` without any knob or the enabling switch (for an engine's environment)."""
    return {k: v for k, v in env.items() if k not in KNOBS and k != ENABLE}


def with_knobs(env: dict[str, str], knobs: Mapping[str, str]) -> dict[str, str]:
    """Scrubbed ``env`` plus the explicitly requested ``knobs`` (and ``ENABLE``)."""
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown test knob(s): {', '.join(unknown)}")
    out = scrub(env)
    if knobs:
        out.update(knobs)
        out[ENABLE] = "1"
    return out
