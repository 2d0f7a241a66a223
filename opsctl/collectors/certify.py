"""I/O of certify: what identifies the certified build.

Model file hashes, the engine's recorded argv, versions (the after-shutdown recheck is
the shutdown check's, opsctl.suite.shutdown.collect).

Everything returns plain values; a file that cannot be read is reported as such, never
raised."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from opsctl.collectors.jsonfile import run_meta

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CHUNK = 1 << 20


def sha256_file(path: Path) -> str | None:
    """The SHA-256 hex digest of the file at ``path``; None when it cannot be read."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def model_files(path: Path | None) -> dict[str, Any]:
    """sha256 of config.json and of every weights file (sorted by name) in ``path``."""
    if path is None or not path.is_dir():
        return {"path": str(path) if path else None, "config_sha256": None, "weights": []}
    weights = [
        {"file": f.name, "size_bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(path.iterdir())
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES
    ]
    return {
        "path": str(path.resolve()),
        "config_sha256": sha256_file(path / "config.json"),
        "weights": weights,
    }


def read_meta(run_dir: Path | None) -> dict[str, Any]:
    """The run directory's meta.json (argv, model path, pids), {} when unreadable."""
    return run_meta(run_dir)


def opsctl_version() -> str:
    """opsctl's version: the one source, the package metadata (``opsctl.__version__``)."""
    from opsctl import __version__

    return __version__
