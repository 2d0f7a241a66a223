"""The advisor on a live fleet: :class:`AdvisedSource` wraps a FleetSource so that every
view it collects carries its findings (``EndpointView.findings``, opsctl.domain.advisor).

The window: for the direct source, the scrapes its tracker keeps for the latency window
(the last ``latency_window_s`` seconds of one server lifetime; ``--once``: what it
watched); for a source without trackers (Prometheus) the figures it gives (rates over
its own rate window). opsctl runs' ledgers (failed patches, test knobs) are re-read
every LEDGER_EVERY_S, not on every collect."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from opsctl.domain import advisor
from opsctl.domain.console import EndpointView, FleetSnapshot

LEDGER_EVERY_S = 5.0
FAILED = "failed"  # engine_patches.patch.FAILED (not imported: it runs inside vLLM)


def ledger_facts(run_dir: str) -> advisor.LocalFacts:
    from opsctl.collectors import ledger

    records = ledger.read_records(Path(run_dir))
    failed = tuple(
        f"{e.name} ({e.role} pid {e.pid}): {e.reason or e.detail or 'failed'}"
        for e in ledger.entries(records)
        if e.status == FAILED
    )
    return advisor.LocalFacts(failed, ledger.test_knobs(records))


class AdvisedSource:
    """A FleetSource whose collect() adds the advisor's findings; everything else is the
    wrapped source's (attributes are looked up on it)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._ledgers: dict[str, tuple[float, advisor.LocalFacts]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def collect(self) -> FleetSnapshot:
        snap = self.source.collect()
        views = tuple(self.advise(v) for v in snap.endpoints)
        return replace(snap, endpoints=views)

    def window(self, url: str) -> advisor.Window | None:
        tracker_of = getattr(self.source, "tracker", None)
        if not callable(tracker_of):
            return None
        lock = getattr(self.source, "lock", None)
        if lock is None:
            return None
        with lock:
            t = tracker_of(url)
            points = list(t.window) if t is not None else []
        return advisor.window_of(points)

    def local(self, view: EndpointView) -> advisor.LocalFacts | None:
        rd = view.target.run_dir
        if not rd:
            return None
        now = time.monotonic()
        seen = self._ledgers.get(rd)
        if seen is None or now - seen[0] >= LEDGER_EVERY_S:
            try:
                seen = (now, ledger_facts(rd))
            except OSError:
                seen = (now, advisor.LocalFacts())
            self._ledgers[rd] = seen
        return seen[1]

    def advise(self, view: EndpointView) -> EndpointView:
        w = self.window(view.target.url)
        found = advisor.window_findings(view, w, self.local(view))
        return replace(view, findings=found)


def advised(source: Any) -> Any:
    """``source`` with the advisor's findings (a replay's recorded frames stay as they
    were recorded)."""
    from opsctl.console.replay import ReplaySource

    return source if isinstance(source, ReplaySource) else AdvisedSource(source)
