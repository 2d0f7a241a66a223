"""One lifetime policy for every opsctl command that starts an engine.

- SIGINT, SIGTERM and SIGHUP all mean "stop now, in order": the first one raises
  :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, or, while a Textual
  app is registered with :func:`tui_app`, asks that app to exit (raising inside its event
  loop would leave the terminal in raw mode), and the command raises afterwards.
- From the first signal on, further signals never raise: they only set :func:`hurry`,
  which makes ``EngineServer.stop()`` skip the polite waits and SIGKILL at once. So a
  second Ctrl-C, or a SIGTERM from a supervisor that lost patience, can never abort a
  stop half-way and leave the engine tree or its /dev/shm segments behind.
- Every engine started in this process is registered in the process's
  ``opsctl.engine.registry.EngineRegistry``; the CLI stops those a command started when
  it ends and the entry point stops any left on every way out, whichever thread started
  them (a diag under ``--tui`` starts its engine in a worker thread).
- If opsctl dies without any chance to clean up (SIGKILL, OOM killer), its engines stop
  themselves: the engine plugin watches the owner given by :func:`owner_env`
  (``engine_patches.watchdog``), and the API server gets a parent-death signal.

Exit codes: the CLI maps ``Terminated`` like Ctrl-C (130); ``serve`` exits 0 after an
orderly stop, as a server asked to stop should.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """The command was asked to stop by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.received: int | None = None  # first signal
        self.hurry = threading.Event()  # a further signal arrived: stop without waiting
        self.app_exit: Callable[[], None] | None = None
        self.shielding = 0  # > 0 while a stop runs: the first signal is deferred
        self.deferred = False


_STATE = _State()


def received() -> int | None:
    """The first stop signal this process got, or None."""
    return _STATE.received


def hurry() -> bool:
    """True once a second stop signal arrived: escalate to SIGKILL without waiting."""
    return _STATE.hurry.is_set()


def _handler(signum: int, frame: Any) -> None:
    if _STATE.received is not None:
        _STATE.hurry.set()  # never raise again: a stop in progress must finish
        return
    _STATE.received = signum
    if _STATE.app_exit is not None:
        _STATE.app_exit()
        return
    if _STATE.shielding:
        _STATE.deferred = True  # raised when the stop is done
        return
    raise Terminated(signum)


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP through the policy (main thread only; idempotent)."""
    if _STATE.installed or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)
    _STATE.installed = True


def raise_if_received() -> None:
    """After a TUI exited because of a signal, raise it as :class:`Terminated`."""
    if _STATE.received is not None:
        raise Terminated(_STATE.received)


@contextlib.contextmanager
def tui_app(exit_app: Callable[[], None]) -> Iterator[None]:
    """While a Textual app runs in the main thread, a stop signal calls ``exit_app``.

    ``exit_app`` must only schedule the exit; call :func:`raise_if_received` afterwards."""
    previous, _STATE.app_exit = _STATE.app_exit, exit_app
    try:
        yield
    finally:
        _STATE.app_exit = previous


@contextlib.contextmanager
def shield() -> Iterator[None]:
    """Around a stop: a first signal does not raise inside it; further ones hurry it.

    A first signal is raised in the main thread once the stop is done; further signals set
    :func:`hurry`."""
    _STATE.shielding += 1
    try:
        yield
    finally:
        _STATE.shielding -= 1
        main = threading.current_thread() is threading.main_thread()
        if main and not _STATE.shielding and _STATE.deferred and _STATE.received is not None:
            _STATE.deferred = False
            raise Terminated(_STATE.received)


def owner_start_ticks(pid: int | str = "self") -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22).

    With the pid it names one process for good, even after the kernel reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after its end
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def owner_env() -> dict[str, str]:
    """Environment that ties an engine to this process (read by engine_patches.watchdog)."""
    import os

    return {"OPSCTL_OWNER_PID": str(os.getpid()), "OPSCTL_OWNER_START": str(owner_start_ticks())}
