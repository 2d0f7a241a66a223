"""The engines a process started, held by an object its owner can see and stop.

An :class:`EngineRegistry` holds every engine (``opsctl.engine.server.EngineServer``)
that registered with it and is not stopped yet, whichever thread started it (a diag under
``--tui`` starts its engine in a worker thread, the console in its own). The CLI opens an
:meth:`EngineRegistry.scope` around each command: the scope records the engines started
while it is open, and the CLI stops exactly those when the command ends, so an engine the
caller had before (a test's shared engine) is never its business.

The registry also owns the start queue (:class:`StartQueue`): with ``OPSCTL_ENGINE_LOCK``
naming a file, opsctl processes on one machine start their engines one after the other
(CI, the benchmarks and the soak run share two cores). The queue is counted per process:
the first engine takes the flock, later ones share it, the last one to stop releases it.

This module imports nothing heavy, so ``opsctl.cli`` can hold the registry without
loading httpx, psutil or vLLM (``opsctl --help`` stays instant).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import IO, Any, Protocol


class Engine(Protocol):
    """What the registry needs of an engine: whether it has stopped, and how to stop it."""

    stop_report: Any

    def stop(self) -> Any:
        """Stop the engine's process tree (idempotent); return its stop report."""


class StartQueue:
    """A process-wide, counted flock on ``OPSCTL_ENGINE_LOCK`` (no queue when unset).

    flock() conflicts between two open file descriptions even inside one process, so a
    second engine of the same process (a session holding two engines, the console starting
    two servers) waiting on its own flock would wait for ever: the first engine of a
    process takes the flock, the others share it, the last one to stop releases it."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.fh: IO[str] | None = None
        self.count = 0

    def acquire(self) -> IO[str] | None:
        """Wait for the machine's engine lock (shared within this process); None if unset."""
        path = os.environ.get("OPSCTL_ENGINE_LOCK")
        if not path:
            return None
        import fcntl

        with self.mutex:
            if self.fh is None:
                try:  # read-only is enough for flock, and works on another user's file
                    fh = open(path)  # noqa: SIM115 - held until the last release
                except FileNotFoundError:
                    fh = open(path, "a")  # noqa: SIM115 - held until the last release
                fcntl.flock(fh, fcntl.LOCK_EX)
                self.fh = fh
            self.count += 1
            return self.fh

    def release(self) -> None:
        """Give back one engine's share; the last share closes the file (the flock goes)."""
        with self.mutex:
            self.count -= 1
            if self.count == 0 and self.fh is not None:
                self.fh.close()
                self.fh = None


class EngineScope:
    """The engines started while a scope of an :class:`EngineRegistry` was open."""

    def __init__(self) -> None:
        self.engines: weakref.WeakSet[Engine] = weakref.WeakSet()

    def stop_all(self) -> list[Any]:
        """Stop the engines of this scope that are still running; their stop reports."""
        return [e.stop() for e in list(self.engines) if e.stop_report is None]


class EngineRegistry:
    """The live engines of one process and the queue their starts wait in."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[Engine] = weakref.WeakSet()
        self._scopes: list[EngineScope] = []
        self._mutex = threading.Lock()
        self.queue = StartQueue()

    def add(self, engine: Engine) -> None:
        """Register an engine about to be launched (in every open scope too)."""
        with self._mutex:
            self._live.add(engine)
            for scope in self._scopes:
                scope.engines.add(engine)

    def discard(self, engine: Engine) -> None:
        """Forget a stopped engine."""
        with self._mutex:
            self._live.discard(engine)

    def live(self) -> list[Engine]:
        """The registered engines that are not stopped yet."""
        with self._mutex:
            return [e for e in self._live if e.stop_report is None]

    def stop_all(self) -> list[Any]:
        """Stop every engine of this registry that is not stopped yet (any thread)."""
        return [engine.stop() for engine in self.live()]

    @contextlib.contextmanager
    def scope(self) -> Iterator[EngineScope]:
        """Record the engines started while the ``with`` block runs, by any thread."""
        scope = EngineScope()
        with self._mutex:
            self._scopes.append(scope)
        try:
            yield scope
        finally:
            with self._mutex:
                self._scopes.remove(scope)


_PROCESS = EngineRegistry()


def process_engines() -> EngineRegistry:
    """The registry of this process: every engine it starts registers here.

    A stop signal ends the whole process and so must stop all of them."""
    return _PROCESS
