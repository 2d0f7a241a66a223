"""opsctl: operator's command line and terminal dashboard for vLLM.

``__version__`` comes from the installed package metadata (pyproject's version), the
one version source; CHANGELOG's top entry names the same version (a test checks)."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("opsctl")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
