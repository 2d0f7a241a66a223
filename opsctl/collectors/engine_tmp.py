"""A private temporary directory for each engine opsctl starts.

vLLM leaves files in the temporary directory at every start, even after an orderly
stop: its ZeroMQ IPC sockets (``VLLM_RPC_BASE_PATH``, default ``$TMPDIR``) and the
``vllm_dist_*`` file of torch.distributed's file:// rendezvous (measured: 7 sockets and
1 file per tiny-model engine, never removed). An engine opsctl starts gets its own
directory for them instead (``$TMPDIR/opsctl-eng-XXXXXXXX``). A Unix socket path must
fit in 107 bytes and vLLM's socket names are 36: where ``$TMPDIR`` is too long for the
extra level, the directory is made in /tmp, and where that fails too the engine keeps
vLLM's default (no private directory). The engine's stop, ``runs clean``'s reap and its
prune of a finished run remove it; so does the engine's API server when opsctl died
without a chance to (``engine_patches.watchdog``).

Removal only ever touches a directory opsctl made: a real directory (not a symlink)
whose name has our prefix and whose marker file names the run it was made for (the rule
is ``engine_patches.private_tmp``, shared with the engine).

torch's compile cache stays shared between engines: ``TORCHINDUCTOR_CACHE_DIR`` keeps its
usual place, and so do inductor's precompiled C++ headers, which torch puts under
``$TMPDIR/torchinductor_<user>`` whatever ``TORCHINDUCTOR_CACHE_DIR`` says: the private
directory holds a link of that name to the shared cache (without it, every engine that
compiles rebuilt the headers: about 10 s of a CPU core at each start, measured on tiny-llama).
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

from engine_patches import private_tmp
from engine_patches.private_tmp import MARKER, PREFIX

__all__ = ["MARKER", "PREFIX", "create", "engine_env", "fits", "remove"]
SUN_PATH_MAX = 107  # bytes of a Unix socket path (sizeof(sockaddr_un.sun_path) - 1)
VLLM_SOCKET_NAME = 36  # vLLM names its IPC sockets by a uuid4
_DIR_LEN = len(PREFIX) + 8 + 2  # mkdtemp's 8 random characters, two slashes


def fits(base: str) -> bool:
    """Whether vLLM's sockets fit in a private directory made under ``base``."""
    return len(os.fsencode(base)) + _DIR_LEN + VLLM_SOCKET_NAME <= SUN_PATH_MAX


def create(run_dir: Path) -> Path | None:
    """Make the private temporary directory for the engine of ``run_dir``; None when none fits.

    None when no temporary directory is short enough, or none can be made."""
    for base in dict.fromkeys([tempfile.gettempdir(), "/tmp"]):
        if not fits(base):
            continue
        try:
            path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
        except OSError:
            continue
        try:
            (path / MARKER).write_text(str(run_dir.resolve()))
        except OSError:
            os.rmdir(path)
            continue
        _link_inductor_cache(path)
        return path
    return None


def inductor_cache_dir() -> str:
    """torch inductor's cache: ``TORCHINDUCTOR_CACHE_DIR``, else torch's default place."""
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), _inductor_dir_name()
    )


def _inductor_dir_name() -> str:
    """``torchinductor_<user>``, as torch names its default cache directory."""
    return "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", _user())


def _link_inductor_cache(path: Path) -> None:
    """Link ``path/torchinductor_<user>`` (where torch puts its precompiled headers) to
    the shared cache; without the link they are only rebuilt, so a failure is ignored."""
    shared = inductor_cache_dir()
    try:
        os.makedirs(shared, exist_ok=True)  # torch's own place: torch would make it too
        os.symlink(shared, path / _inductor_dir_name())
    except OSError:
        pass


def engine_env(tmp_dir: Path) -> dict[str, str]:
    """The environment variables that put the engine's temporary files in ``tmp_dir``.

    torch's compile cache, which lives in the temporary directory by default and should outlive
    one engine, keeps its usual place."""
    return {
        "TMPDIR": str(tmp_dir),
        "VLLM_RPC_BASE_PATH": str(tmp_dir),
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir(),
    }


def _user() -> str:
    """The user as torch's default cache directory names it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return f"uid_{os.getuid()}"


def remove(path: str | Path | None, run_dir: Path) -> str | None:
    """Remove the engine temporary directory ``path``; None when gone, else why it was left.

    ``path`` is the one made for ``run_dir``. None when it is gone (removed now, or before)."""
    return private_tmp.remove(path, run_dir)
