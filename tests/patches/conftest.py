"""Fixtures the patch tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The built tiny-llama's directory: the model config of the schedulers built here."""
    from opsctl.engine.model import resolve

    return str(resolve("tiny-llama").path)
