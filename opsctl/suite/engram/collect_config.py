"""The model config ``engram plan`` reads: a model directory, a file or an example.

A model directory's config.json, a config JSON file, or one of the examples shipped in
opsctl/data."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from opsctl.collectors.jsonfile import load_json_object
from opsctl.errors import BadInput

EXAMPLES = {"deepseek-v4.1-flash": "deepseek-v4.1-flash-engram.json"}


def read_config(model: Path | None, config: str | None) -> tuple[dict[str, Any], str]:
    """(config dict, where it came from) for exactly one of ``model`` and ``config``.

    ``model`` is a directory with a config.json; ``config`` a file, or a name in
    :data:`EXAMPLES`. BadInput else."""
    if (model is None) == (config is None):
        raise BadInput(
            "give exactly one of --model DIR or --config FILE",
            hint=f"shipped examples: --config {', '.join(EXAMPLES)}",
        )
    if model is not None:
        if not model.is_dir():
            raise BadInput(f"--model {model} is not a directory")
        path = model / "config.json"
    elif config in EXAMPLES:
        ref = resources.files("opsctl") / "data" / EXAMPLES[config]
        return json.loads(ref.read_text()), f"example:{config}"
    else:
        path = Path(str(config))
    if not path.is_file():
        raise BadInput(
            f"no such config file: {path}", hint=f"shipped examples: {', '.join(EXAMPLES)}"
        )
    return load_json_object(path), str(path)
