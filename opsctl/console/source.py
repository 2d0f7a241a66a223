"""FleetSource: what the console UI and ``--once`` read.

The UI never knows which implementation it has (direct scraping, Prometheus, a replay)
nor what wraps it (the advisor, GPUs, --tee, --log: :class:`WrappedSource`).

- ``start()`` begins collecting in the background; ``close()`` stops it.
- ``collect()`` returns the current FleetSnapshot at once (no I/O on the caller's thread).
- ``series(url, name)`` is the bounded history of one figure (sparklines).
- ``refresh()`` polls every endpoint now; ``set_paused()`` stops/resumes polling, and
  ``paused`` says which.
- ``wait_settled(timeout)`` waits until every endpoint has enough scrapes for rates.
- ``live``: False for a replay, whose frames do not change by waiting (``--once`` then
  takes the last frame as it is, sends no canary and collects no GPUs).
- ``timeout``: one poll's deadline (``--once`` waits two intervals and it).
- ``settings``: the console's (interval, stall window); None for a replay.
- ``static``: the targets given (URL arguments, a targets file), which ``--tee``/``--log``
  add their servers to; None for a source without such a list (Prometheus, a replay).
- ``api_key_for(target)``: the key ``--once``'s canary sends to ``target``.
- ``tracker(url)``: the endpoint's tracker (its scrapes: the advisor's window), read
  under ``lock``; None for an unknown URL or a source without trackers.
- ``attaches_gpus``: ``collect()`` carries the host's GPUs (the TUI adds no feed).

:class:`SourceDefaults` holds the defaults the sources share (every source derives from
it); :class:`WrappedSource` forwards every member to the source it wraps."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar, overload

from opsctl.console.judge import FleetSnapshot, Target
from opsctl.console.judge_state import EndpointTracker, Settings

START_HINT = (
    "start one with `opsctl serve` in another terminal, "
    "or pass a URL (opsctl console http://HOST:PORT) or --targets FILE"
)
EMPTY_HINT = f"no vLLM server found: {START_HINT}"
T = TypeVar("T")


class FleetSource(Protocol):
    """The interface of a fleet source: what the console UI and ``--once`` call."""

    name: str
    live: bool
    timeout: float
    paused: bool
    settings: Settings | None
    static: list[Target] | None
    lock: contextlib.AbstractContextManager[Any]

    @property
    def attaches_gpus(self) -> bool:
        """Whether ``collect()`` carries the host's GPUs (GpuSource): the TUI adds no feed."""

    def start(self) -> None:
        """Begin collecting in the background."""

    def collect(self) -> FleetSnapshot:
        """The current FleetSnapshot, at once (no I/O on the caller's thread)."""

    def series(self, url: str, name: str) -> list[float]:
        """The bounded history of one figure of one endpoint (a sparkline)."""

    def refresh(self) -> None:
        """Poll every endpoint now."""

    def set_paused(self, paused: bool) -> None:
        """Stop or resume polling."""

    def wait_settled(self, timeout: float) -> bool:
        """Wait until every endpoint has enough scrapes for rates; False on the deadline."""

    def close(self) -> None:
        """Stop collecting."""

    def api_key_for(self, target: Target) -> str | None:
        """The API key sent to ``target`` (``--once``'s canary); None for none."""

    def tracker(self, url: str) -> EndpointTracker | None:
        """The tracker of the endpoint at ``url`` (read under ``lock``); None without one."""


class SourceDefaults:
    """The FleetSource members a source may leave as they are.

    A live source, polled with a 10 s timeout, not paused, without settings, targets of
    its own, trackers or API keys, which attaches no GPUs (a subclass sets what it has)."""

    live = True
    timeout = 10.0
    paused = False
    attaches_gpus = False
    settings: Settings | None = None
    static: list[Target] | None = None
    lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def api_key_for(self, target: Target) -> str | None:
        """No key (a source that knows one says so)."""
        return None

    def tracker(self, url: str) -> EndpointTracker | None:
        """No tracker (a source that keeps them says so)."""
        return None


class Forwarded(Generic[T]):
    """A member of a WrappedSource that is its wrapped source's, read at every access."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forwarded[T]: ...
    @overload
    def __get__(self, obj: WrappedSource, owner: type | None = None) -> T: ...
    def __get__(self, obj: WrappedSource | None, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.source, self.name)

    def __set__(self, obj: WrappedSource, value: T) -> None:
        raise AttributeError(f"{self.name} is the wrapped source's: set it there")


class WrappedSource:
    """A FleetSource over another (``source``): every member is the wrapped source's.

    Each member of FleetSource is named here and forwarded (nothing else is), so a
    wrapper is a complete FleetSource; a subclass overrides what it adds to (``collect``
    mostly, ``start``/``close`` for what it runs itself)."""

    name: Forwarded[str] = Forwarded()
    live: Forwarded[bool] = Forwarded()
    timeout: Forwarded[float] = Forwarded()
    paused: Forwarded[bool] = Forwarded()
    settings: Forwarded[Settings | None] = Forwarded()
    static: Forwarded[list[Target] | None] = Forwarded()
    lock: Forwarded[contextlib.AbstractContextManager[Any]] = Forwarded()
    start: Forwarded[Callable[[], None]] = Forwarded()
    collect: Forwarded[Callable[[], FleetSnapshot]] = Forwarded()
    series: Forwarded[Callable[[str, str], list[float]]] = Forwarded()
    refresh: Forwarded[Callable[[], None]] = Forwarded()
    set_paused: Forwarded[Callable[[bool], None]] = Forwarded()
    wait_settled: Forwarded[Callable[[float], bool]] = Forwarded()
    close: Forwarded[Callable[[], None]] = Forwarded()
    api_key_for: Forwarded[Callable[[Target], str | None]] = Forwarded()
    tracker: Forwarded[Callable[[str], EndpointTracker | None]] = Forwarded()

    # a wrapper that attaches the host's GPUs itself says so (GpuSource)
    adds_gpus: ClassVar[bool] = False

    def __init__(self, source: FleetSource) -> None:
        self.source = source

    @property
    def attaches_gpus(self) -> bool:
        """Whether this wrapper or a source below it attaches the host's GPUs."""
        return self.adds_gpus or self.source.attaches_gpus


class LoopThreadSource(SourceDefaults):
    """What the background sources share: an asyncio loop on one daemon thread.

    A wake event for ``refresh()``, an un-paused event for ``set_paused()``, and
    ``close()`` cancelling every task of the loop before stopping it. Subclasses call
    ``_init_loop(thread_name)`` in ``__init__``, ``_start_loop()`` in ``start()`` (it runs
    their ``_main()`` and sets ``self.main``), and ``_open_events()`` first in ``_main()``."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    wake: asyncio.Event | None
    unpaused: asyncio.Event | None
    main: asyncio.Future | None

    def _init_loop(self, thread_name: str) -> None:
        self.lock = threading.Lock()
        self.paused = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=thread_name, daemon=True)
        self.wake = None
        self.unpaused = None
        self.main = None

    def _start_loop(self) -> None:
        """Start the loop's thread and run the subclass's ``_main()`` on it."""
        self.thread.start()
        self.main = asyncio.run_coroutine_threadsafe(self._main(), self.loop)

    async def _main(self) -> None:
        raise NotImplementedError

    def _open_events(self) -> None:
        """Create the wake and un-paused events; called first by ``_main()``, on the loop."""
        self.wake = asyncio.Event()
        self.unpaused = asyncio.Event()
        self.unpaused.set()

    def refresh(self) -> None:
        """Poll every endpoint now (wakes the loop's waits)."""

        def kick() -> None:
            if self.wake is not None:
                self.wake.set()
                self.wake.clear()

        self.loop.call_soon_threadsafe(kick)

    def set_paused(self, paused: bool) -> None:
        """Stop or resume polling (the loop's tasks wait on the un-paused event)."""
        self.paused = paused

        def apply() -> None:
            if self.unpaused is not None:
                (self.unpaused.clear if paused else self.unpaused.set)()

        self.loop.call_soon_threadsafe(apply)

    def close(self) -> None:
        """Cancel every task of the loop, then stop the loop and join its thread."""
        if self.main is not None:

            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(5)
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
