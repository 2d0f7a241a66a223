"""FleetSource: what the console UI and ``--once`` read. The UI never knows which
implementation it has (direct scraping here; a Prometheus-backed one comes later).

- ``start()`` begins collecting in the background; ``close()`` stops it.
- ``collect()`` returns the current FleetSnapshot at once (no I/O on the caller's thread).
- ``series(url, name)`` is the bounded history of one figure (sparklines).
- ``refresh()`` polls every endpoint now; ``set_paused()`` stops/resumes polling.
- ``wait_settled(timeout)`` waits until every endpoint has enough scrapes for rates.
"""

from __future__ import annotations

from typing import Protocol

from opsctl.domain.console import FleetSnapshot

EMPTY_HINT = (
    "no vLLM server found: start one with `opsctl serve` in another terminal, "
    "or pass a URL (opsctl console http://HOST:PORT) or --targets FILE"
)


class FleetSource(Protocol):
    name: str

    def start(self) -> None: ...

    def collect(self) -> FleetSnapshot: ...

    def series(self, url: str, name: str) -> list[float]: ...

    def refresh(self) -> None: ...

    def set_paused(self, paused: bool) -> None: ...

    def wait_settled(self, timeout: float) -> bool: ...

    def close(self) -> None: ...
