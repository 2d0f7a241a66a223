"""Shared test setup.

- OPSCTL_HOME defaults to <repo>/.opsctl-home so embedded models are built once and
  reused across test modules (CI sets it the same way).
- OPSCTL_ENGINE_LOCK serialises engine starts across concurrent pytest runs on this
  2-core machine (CI runs sequentially anyway).
- ``running_engine`` starts a real vLLM server with serve's machinery and always stops
  it (no process, no shm segment left behind).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")
OPSCTL = [sys.executable, "-m", "opsctl"]


@contextlib.contextmanager
def running_engine(
    model: str = "tiny-llama", *, load_format: str = "auto", timeout: float = 400.0, **launch_kwargs
) -> Iterator:
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    opts = LaunchOptions(
        model=resolve(model), load_format=load_format, label="test", **launch_kwargs
    )
    server = EngineServer(opts)
    try:
        server.start()
        server.wait_healthy(timeout)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def opsctl_home() -> Path:
    return Path(os.environ["OPSCTL_HOME"])


# Terminal settings a CI runner may export change what rich prints (colour codes, width);
# the tests read plain text, as an operator's pipe would get it.
_TERMINAL_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES")


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _TERMINAL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty directory with a short path, for a $TMPDIR: vLLM's Unix sockets must fit
    in 107 bytes, which pytest's tmp_path (~60 characters) plus the engine's private
    directory may not."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ot-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
