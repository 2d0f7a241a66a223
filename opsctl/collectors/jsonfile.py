"""Reading a JSON object an operator points opsctl at; what is wrong is one BadInput line.

A model's config.json, a config file: every way it can be wrong is one clear ``BadInput`` line
(exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opsctl.errors import BadInput


def load_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; BadInput when unreadable, malformed or not an object.

    A JSON object from ``path``; unreadable, malformed or non-object files are
    BadInput with one clear line."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise BadInput(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a JSON object")
    return data
