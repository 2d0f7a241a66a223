"""The one rule for removing an engine's private temporary directory.

Shared by opsctl (its stop, ``runs clean``) and the engine itself (its API server, when
the opsctl process that started it died without a chance to clean up).

opsctl makes the directory (``opsctl.collectors.engine_tmp``) and gives it to the engine
as ``TMPDIR``. Removal only ever touches a directory opsctl made: a real directory (not a
symlink) whose name has our prefix and whose marker file names the run it was made for.

Pure standard library: it runs inside vLLM.
"""

from __future__ import annotations

import os
import shutil

PREFIX = "opsctl-eng-"
MARKER = ".opsctl-engine-tmp"


def remove(path: str | os.PathLike[str] | None, run_dir: str | os.PathLike[str]) -> str | None:
    """Remove the engine temporary directory ``path`` made for ``run_dir``.

    None when it is gone (removed now, or before); otherwise why it was left."""
    if not path:
        return None
    p = os.fspath(path)
    if not os.path.lexists(p):
        return None
    if os.path.islink(p) or not os.path.isdir(p) or not os.path.basename(p).startswith(PREFIX):
        return f"{p} is not an opsctl engine temporary directory: not removed"
    try:
        with open(os.path.join(p, MARKER)) as fh:
            owner = fh.read()
    except OSError:
        return f"{p} has no opsctl marker: not removed"
    if owner != os.path.realpath(run_dir):
        return f"{p} was made for another run ({owner}): not removed"
    try:
        shutil.rmtree(p)
    except OSError as exc:
        return f"cannot remove {p}: {exc}"
    return None


def own_dir(env: dict[str, str] | None = None) -> str | None:
    """In an engine process: its private ``TMPDIR``; None when it kept vLLM's default."""
    env = dict(os.environ) if env is None else env
    tmp = (env.get("TMPDIR") or "").rstrip("/")
    if not env.get("OPSCTL_RUN_DIR") or not os.path.basename(tmp).startswith(PREFIX):
        return None
    return tmp


def remove_own(env: dict[str, str] | None = None) -> str | None:
    """In an engine process: remove its own private ``TMPDIR``.

    The one made for ``OPSCTL_RUN_DIR``; None when there is none or it is gone."""
    env = dict(os.environ) if env is None else env
    tmp = own_dir(env)
    if tmp is None:
        return None  # no private directory (vLLM's default was kept)
    return remove(tmp, env["OPSCTL_RUN_DIR"])
