"""FleetSource: what the console UI and ``--once`` read.

The UI never knows which implementation it has (direct scraping, Prometheus, a replay).

- ``start()`` begins collecting in the background; ``close()`` stops it.
- ``collect()`` returns the current FleetSnapshot at once (no I/O on the caller's thread).
- ``series(url, name)`` is the bounded history of one figure (sparklines).
- ``refresh()`` polls every endpoint now; ``set_paused()`` stops/resumes polling.
- ``wait_settled(timeout)`` waits until every endpoint has enough scrapes for rates.
- ``live`` (default True when absent): False for a replay, whose frames do not change
  by waiting (``--once`` then takes the last frame as it is)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Protocol

from opsctl.domain.console import FleetSnapshot

START_HINT = (
    "start one with `opsctl serve` in another terminal, "
    "or pass a URL (opsctl console http://HOST:PORT) or --targets FILE"
)
EMPTY_HINT = f"no vLLM server found: {START_HINT}"


class FleetSource(Protocol):
    """The interface of a fleet source: what the console UI and ``--once`` call."""

    name: str

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


class LoopThreadSource:
    """What the background sources share: an asyncio loop on one daemon thread.

    A wake event for ``refresh()``, an un-paused event for ``set_paused()``, and
    ``close()`` cancelling every task of the loop before stopping it. Subclasses call
    ``_init_loop(thread_name)`` in ``__init__``, ``_start_loop()`` in ``start()`` (it runs
    their ``_main()`` and sets ``self.main``), and ``_open_events()`` first in ``_main()``."""

    paused: bool
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
