"""Reading a JSON object an operator points opsctl at; what is wrong is one BadInput line.

A model's config.json, a config file: every way it can be wrong is one clear ``BadInput`` line
(exit 2). A file opsctl only consults (a run's meta.json, a model's config.json while
planning) is read leniently instead: ``json_object`` gives ``{}`` for one missing or damaged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opsctl.errors import BadInput


def load_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; BadInput when unreadable, malformed or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise BadInput(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a JSON object")
    return data


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when missing, unreadable or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def run_meta(run_dir: Path | str | None) -> dict[str, Any]:
    """A run directory's meta.json; ``{}`` without a run directory or a readable object."""
    return json_object(Path(run_dir) / "meta.json") if run_dir else {}
