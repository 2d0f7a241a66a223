"""Building an embedded model or adapter directory, atomically and never over another's.

A build writes into a fresh temporary directory next to its destination, drops opsctl's
marker file in it (name, version, what was built) and renames it into place; whatever
fails on the way removes the temporary directory. Only a real directory holding opsctl's
marker for that name may be replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opsctl.errors import BadInput


def read_marker(path: Path, marker_file: str) -> dict[str, Any] | None:
    """The JSON object in ``path``'s marker file; None when there is no usable one.

    None when ``path`` is not a real directory or the marker is missing, a link, unreadable or
    not an object."""
    marker = path / marker_file
    if path.is_symlink() or not path.is_dir() or marker.is_symlink() or not marker.is_file():
        return None
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def built_by_opsctl(path: Path, marker_file: str) -> bool:
    """Whether ``path`` holds opsctl's marker for a build of that name (any version)."""
    meta = read_marker(path, marker_file)
    return meta is not None and meta.get("name") == path.name and "version" in meta


def build_into(
    dest: Path,
    marker_file: str,
    marker: dict[str, Any],
    write: Callable[[Path], None],
    what: str = "",
) -> Path:
    """Build into a temporary directory beside ``dest`` and rename it into place.

    ``write(tmp)`` fills the temporary directory, then the marker is added; only a build of
    opsctl's is replaced. ``what`` names the build in the error when the parent directory cannot
    be written ("adapters")."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{marker['name']}-", dir=dest.parent))
    except OSError as exc:
        doing = f"cannot build {what} into" if what else "cannot build into"
        raise BadInput(f"{doing} {dest.parent}: {exc.strerror or exc}") from None
    try:
        write(tmp)
        (tmp / marker_file).write_text(json.dumps(marker) + "\n")  # in the order given
        if dest.exists() or dest.is_symlink():
            if not built_by_opsctl(dest, marker_file):  # it may have appeared meanwhile
                raise BadInput(f"{dest} exists and was not built by opsctl (no {marker_file})")
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
