"""One dashboard snapshot of a supervised server, read once and frozen.

State, load progress, process tree, key metrics, patch ledger and log tail. The CLI and the TUI
render the same snapshot (and recorded JSONL snapshots replay into the TUI).

``test_knobs`` comes from the engine's own ledger (every process records the test knobs
it honours), so the dashboard warns about a knob-altered engine from the engine's truth."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import httpx

from opsctl.collectors import http, ledger
from opsctl.collectors.metrics import MetricsSnapshot, fetch_metrics
from opsctl.collectors.processes import ProcessTree, snapshot_tree
from opsctl.domain.metrics import KeyMetrics, key_metrics
from opsctl.domain.serverlog import LoadProgress, decisive_lines, load_progress
from opsctl.serve import judge_state


@dataclass(frozen=True, slots=True)
class ServeSnapshot:
    """What the serve dashboard shows at one moment: state, load, processes, metrics, log."""

    taken_at: float
    url: str
    model: str
    load_format: str
    run_dir: str
    state: str
    elapsed_s: float
    time_to_healthy_s: float | None
    progress: LoadProgress
    tree: ProcessTree
    metrics: KeyMetrics | None
    ledger: tuple[ledger.LedgerEntry, ...]
    log_tail: tuple[str, ...]
    death_reason: tuple[str, ...] = ()
    test_knobs: dict[str, str] = field(default_factory=dict)
    # the rank that ended first, how, what the others did, and its last log lines
    # (opsctl.domain.deaths.FirstDeath.lines); also while the API server still runs
    first_death: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """The snapshot as a JSON object (what recordings hold)."""
        return asdict(self)


def from_dict(d: dict) -> ServeSnapshot:
    """Rebuild a snapshot from its JSON form (recordings, UI tests)."""
    from opsctl.collectors.processes import ProcInfo

    tree = d["tree"]
    return ServeSnapshot(
        taken_at=d["taken_at"],
        url=d["url"],
        model=d["model"],
        load_format=d["load_format"],
        run_dir=d["run_dir"],
        state=d["state"],
        elapsed_s=d["elapsed_s"],
        time_to_healthy_s=d.get("time_to_healthy_s"),
        progress=LoadProgress(**d["progress"]),
        tree=ProcessTree(
            tree["root_pid"], tree["taken_at"], tuple(ProcInfo(**p) for p in tree["processes"])
        ),
        metrics=KeyMetrics(**d["metrics"]) if d.get("metrics") else None,
        ledger=tuple(ledger.LedgerEntry(**e) for e in d.get("ledger", [])),
        log_tail=tuple(d.get("log_tail", [])),
        death_reason=tuple(d.get("death_reason", [])),
        test_knobs=dict(d.get("test_knobs") or {}),
        first_death=tuple(d.get("first_death") or ()),
    )


_POLL_LINES = ('"GET /metrics', '"GET /health')


def quiet_tail(log: str, n: int) -> list[str]:
    """Last n log lines without the access-log lines of our own polling."""
    return [
        line for line in log.splitlines()[-(n * 4) :] if not any(p in line for p in _POLL_LINES)
    ][-n:]


class ServeCollector:
    """Collects ServeSnapshots of an EngineServer; keeps the previous /metrics for rates."""

    def __init__(self, server, client: httpx.Client | None = None) -> None:
        self.server = server
        self.client = client or http.client(getattr(server.opts, "api_key", None), timeout=2.0)
        self.prev_metrics: MetricsSnapshot | None = None
        self.stopping = False
        self.death: tuple[str, ...] = ()  # the first rank death's lines, once one is known
        self.judged_dead = False

    def collect(self) -> ServeSnapshot:
        """Read the supervised server once into a :class:`ServeSnapshot`."""
        s = self.server
        log = s.launch_log_text()
        progress = load_progress(log)
        exit_code = s.exited()
        healthy = exit_code is None and s.health(self.client)
        if healthy and s.healthy_at is None:
            s.healthy_at = time.time()
        metrics = None
        if healthy:
            cur = fetch_metrics(self.client, s.url)
            if cur.error is None:
                metrics = key_metrics(cur, self.prev_metrics)
                self.prev_metrics = cur
        if exit_code is None or not self.death:
            s.track()  # also notes the API server's end, once
        state = judge_state.derive_state(exit_code, healthy, progress, self.stopping)
        self._first_death(healthy, dead=state == judge_state.DEAD)
        records = ledger.read_records(s.run_dir)
        return ServeSnapshot(
            taken_at=time.time(),
            url=s.url,
            model=s.opts.model.name,
            load_format=s.opts.load_format,
            run_dir=str(s.run_dir),
            state=state,
            elapsed_s=round(time.time() - s.started_at, 1),
            time_to_healthy_s=round(s.healthy_at - s.started_at, 2) if s.healthy_at else None,
            progress=progress,
            tree=snapshot_tree(s.pid),
            metrics=metrics,
            ledger=ledger.entries(records),
            log_tail=tuple(quiet_tail(log, 12)),
            death_reason=tuple(decisive_lines(log)) if state == judge_state.DEAD else (),
            test_knobs=ledger.test_knobs(records),
            first_death=self.death,
        )

    def _first_death(self, healthy: bool, dead: bool) -> None:
        """Judge the first rank death again when something new ended, and once the server
        is dead (never raises: a failed judgement leaves the last one shown)."""
        s = self.server
        if not hasattr(s, "first_death"):  # a stand-in server
            return
        news = s.rank_ended()
        if dead and not self.judged_dead:
            news, self.judged_dead = True, True
        if not news:
            return
        try:
            found = s.first_death(None if dead else healthy)
        except Exception:
            return
        if found is not None:
            self.death = found.lines()

    def close(self) -> None:
        """Close the collector's HTTP client."""
        self.client.close()
