"""``console --once``: one look at the fleet that never passes a stalled engine.

A single interval cannot tell a stalled engine from a busy one: both have requests
running, and a stall is generation staying flat for the stall window. So the look lasts
one interval (two scrapes: rates need two) for an idle or progressing fleet, and longer
only while some endpoint is undecided (requests running, generation not seen moving):
until it moves (busy) or the stall window has passed (stalled). The deadline covers
the window plus a slow scrape; what is still undecided then is stalled
(opsctl.console.judge_state.settle_undecided)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from opsctl.console.judge import FleetSnapshot
from opsctl.console.judge_state import Settings, settle_undecided, undecided
from opsctl.console.source import FleetSource

CHECK_EVERY_S = 0.05  # how often the collected views are looked at (no I/O: a lock)


@dataclass(frozen=True, slots=True)
class Observation:
    """What ``--once`` saw: the snapshot, how long it watched, whether it settled."""

    snapshot: FleetSnapshot
    observed_s: float  # from start() to the snapshot
    settled: bool  # every endpoint had its scrapes before the settle deadline


def settle_timeout(source: FleetSource, interval_s: float) -> float:
    """Seconds ``--once`` waits for every endpoint's scrapes: two intervals and a timeout."""
    return 2 * interval_s + source.timeout + 5.0


def observe(source: FleetSource, settings: Settings) -> Observation:
    """Start ``source``, look until every endpoint is decided (or the deadline), close it."""
    t0 = time.monotonic()
    source.start()
    try:
        settled = source.wait_settled(timeout=settle_timeout(source, settings.interval_s))
        snap = source.collect()
        if source.live:  # a replay's last frame is what it is
            # the stall is counted from the first scrapes, which finished by now; a scrape
            # that finishes after the window passed decides (it may take a timeout)
            deadline = (
                time.monotonic()
                + settings.stall_window_s
                + 2 * settings.interval_s
                + source.timeout
            )
            while any(undecided(v) for v in snap.endpoints) and time.monotonic() < deadline:
                time.sleep(CHECK_EVERY_S)
                snap = source.collect()
    finally:
        source.close()
    observed = time.monotonic() - t0
    if source.live:
        views = settle_undecided(snap.endpoints, observed, settings.stall_window_s)
        snap = replace(snap, endpoints=views)
    return Observation(snap, observed, settled)


def canaried(snap: FleetSnapshot, source: FleetSource, settings: Settings) -> FleetSnapshot:
    """The snapshot after a 1-token canary to every ready endpoint scrapes can't vouch for.

    Send the canary (one 1-token completion, in parallel) to every ready endpoint the
    scrapes cannot vouch for: an engine stopped while idle keeps /health 200 and its
    gauges at 0. On a server of several data-parallel engines, one canary per idle
    engine, sent to it alone (``X-data-parallel-rank``), the server ready or busy: a
    busy engine's progress says nothing of an idle one. For a live source, with the API
    key it gives (``api_key_for``): the direct one, and the Prometheus one, whose targets
    get the canary too (Prometheus's samples cannot show an engine stopped while idle
    either); not a replay."""
    if not settings.canary_timeout_s or not source.live:
        return snap
    from concurrent.futures import ThreadPoolExecutor

    from opsctl.console.judge_state import canary_engines

    todo = [v for v in snap.endpoints if v.info.models and (_whole(v) or canary_engines(v))]
    if not todo:
        return snap
    timeout = settings.canary_timeout_s
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        judged = pool.map(lambda v: _canary(v, timeout, source.api_key_for(v.target)), todo)
        results = {v.target.url: j for v, j in zip(todo, judged, strict=True)}
    views = tuple(results.get(v.target.url, v) for v in snap.endpoints)
    return replace(snap, endpoints=views)


def _whole(v) -> bool:
    """A ready server of one engine: the canary goes to the server as a whole."""
    from opsctl.console.judge_state import READY

    return v.state == READY and len(v.engines) < 2


def _canary(v, timeout: float, api_key: str | None):
    """The view of ``v`` after its canary (one per idle engine on a DP server)."""
    from opsctl.collectors.canary import send, send_each
    from opsctl.console.judge_state import canary_engines, judge_canary, judge_engine_canaries

    model = v.info.models[0].id
    if _whole(v):
        r = send(v.target.url, model, timeout, api_key)
        state, reason = judge_canary(v.state, v.reason, r.ok, r.detail)
        return replace(v, state=state, reason=reason)
    results = send_each(v.target.url, model, timeout, api_key, canary_engines(v))
    return judge_engine_canaries(v, results)


def report(source: FleetSource, settings: Settings, *, as_json: bool) -> int:
    """``--once``: observe, print the document or the table, return the exit code.

    The document (``--json``) or the table goes to stdout; the verdict's reason (one
    ``opsctl: error:`` line unless all is well) and any hint to stderr. Nothing found
    prints no table."""
    import sys

    from opsctl.console.report import document, render_plain
    from opsctl.console.source import EMPTY_HINT, START_HINT
    from opsctl.output import emit, info

    seen = observe(source, settings)
    snap = canaried(seen.snapshot, source, settings)
    if snap.host_gpus is None and source.live:  # a replay keeps its own
        from opsctl.collectors.gpu import with_gpus

        snap = with_gpus(snap)  # a source without GpuSource: one GPU collection now
    doc = document(snap, stall_window_s=settings.stall_window_s, observed_s=seen.observed_s)
    if as_json or snap.endpoints:  # no table of nothing: the reason goes to stderr
        emit(doc, as_json=as_json, render=lambda c: render_plain(c, snap))
    code = int(doc["exit_code"])
    hint = snap.hint
    if not snap.endpoints:
        hint = START_HINT if hint == EMPTY_HINT else hint
    if code:  # one line says why (none found, none answered, which failed)
        print(f"opsctl: error: {doc['reason']}", file=sys.stderr)
    if hint:
        info(f"hint: {hint}", markup=False)
    return code
