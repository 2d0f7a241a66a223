"""The advisor on a live fleet: AdvisedSource adds findings to every view.

The window: for the direct source, the scrapes its tracker keeps for the latency window
(the last ``latency_window_s`` seconds of one server lifetime; ``--once``: what it
watched); for a source without trackers (Prometheus) the figures it gives (rates over
its own rate window). opsctl runs' ledgers (failed patches, test knobs) are re-read
every LEDGER_EVERY_S, not on every collect."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from opsctl.console import judge_advisor as advisor
from opsctl.console.judge import EndpointView, FleetSnapshot
from opsctl.console.source import FleetSource, WrappedSource

LEDGER_EVERY_S = 5.0
FAILED = "failed"  # engine_patches.patch.FAILED (not imported: it runs inside vLLM)


def ledger_facts(run_dir: str) -> advisor.LocalFacts:
    """The advisor's facts from an opsctl run's ledger: failed patches, test knobs."""
    from opsctl.collectors import ledger

    records = ledger.read_records(Path(run_dir))
    failed = tuple(
        f"{e.name} ({e.role} pid {e.pid}): {e.reason or e.detail or 'failed'}"
        for e in ledger.entries(records)
        if e.status == FAILED
    )
    return advisor.LocalFacts(failed, ledger.test_knobs(records))


class AdvisedSource(WrappedSource):
    """A FleetSource whose collect() adds the advisor's findings to every view.

    Everything else is the wrapped source's (WrappedSource)."""

    def __init__(self, source: FleetSource) -> None:
        super().__init__(source)
        self._ledgers: dict[str, tuple[float, advisor.LocalFacts]] = {}
        # url -> (what the findings were computed from, the findings): a collect between
        # two scrapes (the TUI's redraws, --once's checks) does not compute them again
        self._memo: dict[str, tuple[tuple, tuple[advisor.Advice, ...]]] = {}

    def collect(self) -> FleetSnapshot:
        """The wrapped source's snapshot, every view with its findings."""
        snap = self.source.collect()
        views = tuple(self.advise(v) for v in snap.endpoints)
        if len(self._memo) > len(views):  # endpoints that left the fleet
            urls = {v.target.url for v in views}
            self._memo = {u: m for u, m in self._memo.items() if u in urls}
        return replace(snap, endpoints=views)

    def window(self, url: str) -> advisor.Window | None:
        """The advisor's window of an endpoint from its tracker's scrapes; None without."""
        with self.source.lock:
            t = self.source.tracker(url)
            points = list(t.window) if t is not None else []
        return advisor.window_of(points)

    def local(self, view: EndpointView) -> advisor.LocalFacts | None:
        """The advisor's ledger facts of an opsctl run's endpoint; None for others."""
        rd = view.target.run_dir
        if not rd:
            return None
        return self._ledger(rd)[1]

    def _ledger(self, rd: str) -> tuple[float, advisor.LocalFacts]:
        now = time.monotonic()
        seen = self._ledgers.get(rd)
        if seen is None or now - seen[0] >= LEDGER_EVERY_S:
            try:
                seen = (now, ledger_facts(rd))
            except OSError:
                seen = (now, advisor.LocalFacts())
            self._ledgers[rd] = seen
        return seen

    def advise(self, view: EndpointView) -> EndpointView:
        """The view with its findings (recomputed only when a new scrape came)."""
        url, rd = view.target.url, view.target.run_dir
        seen = self._ledger(rd) if rd else None
        key = (view.scrapes, view.last_scrape_at, view.state, view.gpus, seen and seen[0])
        memo = self._memo.get(url)
        if memo is None or memo[0] != key:
            w = self.window(url)
            memo = (key, advisor.window_findings(view, w, seen[1] if seen else None))
            self._memo[url] = memo
        return replace(view, findings=memo[1])


def advised(source: FleetSource) -> FleetSource:
    """``source`` with the advisor's findings (a replay stays as recorded)."""
    from opsctl.console.replay import ReplaySource

    return source if isinstance(source, ReplaySource) else AdvisedSource(source)
