"""Shared test setup.

- OPSCTL_HOME defaults to <repo>/.opsctl-home so embedded models are built once and
  reused across test modules (CI sets it the same way).
- OPSCTL_ENGINE_LOCK serialises engine starts across concurrent pytest runs on this
  2-core machine (CI runs sequentially anyway).
- ``running_engine`` starts a real vLLM server with serve's machinery and always stops
  it (no process, no shm segment left behind): for a test that owns its engine (kills,
  signals, freezes it...). A test that only reads from its engine uses the session pool
  (``engine_pool``, tests/engine_pool.py; tests/ENGINES.md says who is which).
- Order: modules without engines first (with -x a broken tree fails in the first
  minutes), then engine modules, those sharing a pooled engine back to back.
- Every test that starts an engine is marked ``engine`` (``make test-fast`` deselects
  them): a test without the mark that starts one in this process fails.
- At the end the suite prints how many engines it started and the seconds spent in
  engine starts, per module (tests/engine_pool.py, Accounting).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_pool import ACCOUNTING, SAME_WORKER, bare_starts, module_cost, run_order

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")
# `make test`'s engine tier runs on 2 pytest-xdist workers (tests/tiers.sh): one engine at
# a time per worker, so each worker has its own lock (two runs on one machine still share
# them: at most one engine per worker slot); modules sharing a pooled engine go to one
# worker (xdist_group, below)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OPSCTL_ENGINE_LOCK"] += "." + os.environ["PYTEST_XDIST_WORKER"]
OPSCTL = [sys.executable, "-m", "opsctl"]


@contextlib.contextmanager
def running_engine(
    model: str = "tiny-llama", *, load_format: str = "auto", timeout: float = 400.0, **launch_kwargs
) -> Iterator:
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    # single process (the model runs in the EngineCore, which the API server forks), as
    # opsctl's check engines run: ~15 s less per start; a test about vLLM's Worker process
    # passes single_process=False
    launch_kwargs.setdefault("single_process", True)
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


@contextlib.contextmanager
def two_engines(
    first: dict, second: dict | None = None, *, model: str = "tiny-llama", bare: bool = False
) -> Iterator[tuple]:
    """Two real engines for a module that needs two at once; yields (first, second).

    Both start under one hold of the engine lock (a worker starts no other engine while
    they run), each with :func:`running_engine` and its launch keywords: ``first``, and
    ``second`` (None: the same as ``first``). ``bare``: the second is a bare `vllm serve`
    of ``model`` (tests/bare_vllm.py), not an opsctl run.
    """
    from opsctl.engine.model import resolve
    from tests.bare_vllm import _engine_lock, bare_vllm, no_inner_lock

    with contextlib.ExitStack() as stack:
        stack.enter_context(_engine_lock())
        stack.enter_context(no_inner_lock())
        a = stack.enter_context(running_engine(model, **first))
        if bare:
            b = stack.enter_context(bare_vllm(str(resolve(model).path)))
        else:
            b = stack.enter_context(running_engine(model, **(first if second is None else second)))
        yield a, b


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An OPSCTL_HOME of this test (its own empty runs/) that still has the built models.

    A module that wants another home (no models, a ledger...) defines its own ``home``.
    """
    real = Path(os.environ["OPSCTL_HOME"])
    h = tmp_path / "home"
    (h / "runs").mkdir(parents=True)
    (h / "models").symlink_to(real / "models", target_is_directory=True)
    monkeypatch.setenv("OPSCTL_HOME", str(h))
    return h


_POOLS: list = []  # the session's EnginePool, once a test asked for it


@pytest.fixture(scope="session")
def engine_pool() -> Iterator:
    """The session's engine pool (tests/engine_pool.py); stopped at the session end."""
    from tests.engine_pool import EnginePool

    pool = EnginePool()
    _POOLS.append(pool)
    try:
        yield pool
    finally:
        pool.close()


def pool_names(item: pytest.Item | None) -> set[str]:
    if item is None:
        return set()
    return {name for m in item.iter_markers("pool") for name in m.args}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pool(*names): reads from these pooled engines")
    ACCOUNTING.runs_root = Path(os.environ["OPSCTL_HOME"]) / "runs"
    ACCOUNTING.watch()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cheap modules first, then engine modules; those sharing a pooled engine back to
    back (tests/engine_pool.py, run_order). Modules stay whole, their tests in order.
    Under pytest-xdist's ``--dist loadgroup`` (the engine tier) an engine module is one
    unit of work, and the modules sharing a pooled engine are one (before xdist reads
    the marks: tryfirst)."""
    groups: dict[object, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(getattr(item, "module", None) or item.parent, []).append(item)
    modules = [
        (
            any(i.get_closest_marker("engine") is not None for i in group),
            min((n for i in group for n in pool_names(i)), default=None),
        )
        for group in groups.values()
    ]
    ordered = list(groups.values())
    for (engine, pool), group in zip(modules, ordered, strict=True):
        if engine:
            path = group[0].nodeid.split("::")[0]
            unit = SAME_WORKER.get(os.path.basename(path)) or (f"pool-{pool}" if pool else path)
            for item in group:
                item.add_marker(pytest.mark.xdist_group(unit))
    costs = [module_cost(group[0].nodeid.split("::")[0]) for group in ordered]
    items[:] = [item for i in run_order(modules, costs) for item in ordered[i]]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    with ACCOUNTING.watching(item.nodeid.split("::")[0]):
        yield


def _unmarked_engine_check(item: pytest.Item):
    """A test without the ``engine`` mark that starts an engine in this process (in its
    setup or its call) fails: ``make test-fast`` would start it. Subprocess starts are
    only counted: another pytest on the same OPSCTL_HOME may create runs meanwhile."""
    if item.get_closest_marker("engine") is not None:
        return (yield)
    before, bare = ACCOUNTING.listing(), len(bare_starts())
    result = yield
    started = len(ACCOUNTING.own(ACCOUNTING.listing() - before)) + len(bare_starts()) - bare
    if started:
        pytest.fail(
            f"{item.nodeid} started {started} engine(s) but is not marked engine "
            "(add pytestmark = pytest.mark.engine)",
            pytrace=False,
        )
    return result


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_unmarked_engine_check)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_unmarked_engine_check)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the pooled engine after the last test that declared it: this process holds
    the engine lock while it lives, and the next test may start an engine elsewhere."""
    for pool in _POOLS:
        if pool.alive is not None and pool.alive not in pool_names(nextitem):
            pool.release()


_WORKER_POOLS: list[str] = []  # pool summaries of the xdist workers (the controller's)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """An xdist worker hands its engine accounting to the controller (workeroutput)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["engine_accounting"] = ACCOUNTING.export([p.summary() for p in _POOLS])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    data = getattr(node, "workeroutput", {}).get("engine_accounting")
    if data:
        _WORKER_POOLS.extend(ACCOUNTING.merge(data))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = ACCOUNTING.summary([p.summary() for p in _POOLS] + _WORKER_POOLS)
    if lines:
        terminalreporter.section("engine starts")
        for line in lines:
            terminalreporter.write_line(line)


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
