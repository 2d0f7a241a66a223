"""Weights an engine loads, defined once: vLLM's ``--load-format`` values opsctl passes on.

``auto``: real weights in whatever format the model has; ``safetensors``: real weights from
safetensors files; ``dummy``: random weights (opsctl's dummy_fill patch gives Engram tables
constants). Also the console's words for them (``real``, ``dummy``).
Used by serve, every diag that starts an engine, certify and the console's start form.
"""

from __future__ import annotations

from opsctl.errors import BadInput

LOAD_FORMATS = ("auto", "safetensors", "dummy")
LOAD_FORMAT_HELP = "auto or safetensors (the model's real weights) or dummy (random weights)"
# the console's start form: its words, and vLLM's names as given
WEIGHTS = {"dummy": "dummy", "real": "auto", **{f: f for f in LOAD_FORMATS}}


def check_load_format(value: str, flag: str = "--load-format") -> str:
    """``value`` when it is one of LOAD_FORMATS; BadInput naming them else."""
    if value not in LOAD_FORMATS:
        raise BadInput(f"{flag} must be auto, safetensors or dummy, not {value!r}")
    return value


def load_format_of(weights: str) -> str:
    """The load format for the console's ``weights`` word (dummy, real, or a format)."""
    if weights not in WEIGHTS:
        raise BadInput(f"weights are dummy or real (or auto, safetensors), not {weights!r}")
    return WEIGHTS[weights]
