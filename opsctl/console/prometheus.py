"""PrometheusSource: the fleet read from a Prometheus server's HTTP API.

It scrapes no endpoint itself: same FleetSource interface, same views, same
opsctl.console/1 JSON; the UI does not know which source it has.

One background event-loop thread polls Prometheus every period (the console's interval,
but never faster than the endpoints' scrape interval): the active targets, one instant
query (every figure of every endpoint, split by the instance label) and one range
selector (raw samples for the stall rule), the alerts, and the last probes of opsctl's
canary job (the blackbox exporter's 1-token completion, job ``vllm-canary``: a ready
endpoint whose probe got no answer is stalled, prom_view.with_probe), concurrently,
each under the source's timeout. The latency percentiles (the queries that cost
Prometheus most) run apart, every LATENCY_EVERY_S or four times what they took,
whichever is longer, and a poll uses the latest that came back. A poll that takes long stretches the period
(at least twice the last poll), so a slow Prometheus is not piled on. Parsing and
decisions are pure (opsctl.console.judge_prom, prom_view). When Prometheus does not answer, the
rows keep their last data (their age grows) and the hint says why."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from opsctl.console import alerts as prom_alerts
from opsctl.console import judge_prom as prom
from opsctl.console import judge_prom_view as prom_view
from opsctl.console.judge import FleetSnapshot
from opsctl.console.judge_state import Settings
from opsctl.console.source import LoopThreadSource
from opsctl.console.targets import normalise_url
from opsctl.domain.alert_rules import CANARY_JOB
from opsctl.errors import BadInput, EngineUnreachable

LATENCY_EVERY_S = 15.0  # percentiles are over the 60 s latency window anyway
LATENCY_SHARE = 4  # ... and at least 4x what the last took (Prometheus's busiest query)
_ERRORS = (httpx.HTTPError, prom.PromError, ValueError, KeyError, TypeError)


class PrometheusSource(LoopThreadSource):
    """The fleet source that reads every endpoint from Prometheus's HTTP API."""

    name = prom_view.SOURCE

    def __init__(
        self,
        url: str,
        *,
        job: str | None = None,
        settings: Settings | None = None,
        timeout: float | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.api_key = api_key  # for --once's canary to the servers it reads
        self.job = job or None
        self.settings = settings or Settings()
        self.scrape_s: float | None = None  # the endpoints' scrape interval, once known
        self.poll_s: float | None = None  # how long the last poll took
        self.timeout = timeout if timeout is not None else max(5.0, min(30.0, 2 * self.period))
        self.endpoints: dict[str, prom_view.PromEndpoint] = {}
        self.latency: dict[prom.Key, dict[str, float | None]] = {}
        self.latency_task: asyncio.Task | None = None
        self.latency_started = 0.0
        self.latency_error: str | None = None
        self.latency_s: float | None = None  # how long the last latency query took
        self.complete = False  # a poll was applied with latency figures (or their error)
        self.error: str | None = None
        self.hint: str | None = None
        self.alerts: list = []  # what /api/v1/alerts said last (opsctl.console.alerts)
        self.alerts_error: str | None = None
        self.probes: dict[str, prom.Probe] = {}  # the blackbox canary's, by instance
        self.polls = 0
        self._init_loop("console-prom")

    @property
    def period(self) -> float:
        """Seconds between polls: the interval, no faster than scrapes or 2x the last poll.

        A busy Prometheus is not piled on."""
        return max(self.settings.interval_s, self.scrape_s or 0.0, 2 * (self.poll_s or 0.0))

    @property
    def data_interval(self) -> float:
        """How old a healthy row's data can be: a scrape interval plus a poll period.

        The scrape interval is Prometheus's sample, the poll period the console's read.
        Snapshots carry it as their interval, so a row is called stale (1.5 intervals)
        only when it missed a scrape."""
        return self.period + (self.scrape_s or 0.0)

    def check(self) -> None:
        """Check that a Prometheus API answers at the URL (else exit 3, or 2).

        Raise EngineUnreachable (exit 3) when nothing answers at the URL, BadInput (2)
        when what answers is not a Prometheus API."""
        try:
            r = httpx.get(f"{self.url}/api/v1/status/buildinfo", timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"cannot reach Prometheus at {self.url}: {type(exc).__name__}: {exc}"[:300]
            ) from None
        try:
            prom.data_of(r.json())
        except (ValueError, prom.PromError) as exc:
            raise BadInput(
                f"{self.url} is not a Prometheus API (GET /api/v1/status/buildinfo: HTTP "
                f"{r.status_code}: {exc})"[:300]
            ) from None

    def api_key_for(self, target) -> str | None:
        """The API key ``--once``'s canary sends to the server ``target`` (--api-key)."""
        return self.api_key

    # ---- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the polling loop on its thread."""
        self._start_loop()

    async def _main(self) -> None:
        self._open_events()
        async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout) as client:
            while True:
                await self.unpaused.wait()
                t0 = time.monotonic()
                await self._poll(client)
                delay = self.period - (time.monotonic() - t0)
                if delay > 0:
                    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), delay)

    async def _get(
        self, client: httpx.AsyncClient, path: str, data: dict | None = None, timeout=None
    ):
        t = timeout or self.timeout
        r = await (client.post(path, data=data, timeout=t) if data else client.get(path, timeout=t))
        try:
            return r.json()
        except ValueError:
            r.raise_for_status()
            raise prom.PromError(f"{path}: HTTP {r.status_code}, not JSON") from None

    async def _fetch(self, client: httpx.AsyncClient) -> tuple[dict, list, list]:
        targets_path = "/api/v1/targets?state=active"
        if self.scrape_s is None:  # the windows depend on the scrape interval
            tdoc = await self._get(client, targets_path)
            found = prom.parse_targets(tdoc)
            self.scrape_s = prom_view.scrape_interval(found, self.settings.interval_s)
        w = prom_view.windows(self.settings, self.scrape_s)
        self._start_latency(client, w)
        tdoc, vdoc, mdoc, _, _ = await asyncio.gather(
            self._get(client, targets_path),
            self._get(client, "/api/v1/query", {"query": prom.figures_query(self.job, w)}),
            self._get(client, "/api/v1/query", {"query": prom.stall_query(self.job, w)}),
            self._alerts(client),
            self._probes(client),
        )
        return tdoc, prom.data_of(vdoc, "vector"), prom.data_of(mdoc, "matrix")

    async def _alerts(self, client: httpx.AsyncClient) -> None:
        """The alerts Prometheus holds; a failure keeps the last ones and is remembered."""
        try:
            self.alerts = await prom_alerts.fetch(client, self.timeout)
            self.alerts_error = None
        except _ERRORS as exc:
            self.alerts_error = f"alerts: {type(exc).__name__}: {exc}"[:300]

    async def _probes(self, client: httpx.AsyncClient) -> None:
        """The blackbox canary's last probes (none without its scrape job); kept on failure."""
        query = {"query": prom.canary_query(CANARY_JOB)}
        with contextlib.suppress(*_ERRORS):
            doc = await self._get(client, "/api/v1/query", query)
            self.probes = prom.parse_probes(prom.data_of(doc, "vector"))

    def _start_latency(self, client: httpx.AsyncClient, w: prom.Windows) -> None:
        busy = self.latency_task is not None and not self.latency_task.done()
        every = max(LATENCY_EVERY_S, LATENCY_SHARE * (self.latency_s or 0.0))
        if busy or time.monotonic() - self.latency_started < every:
            return
        self.latency_started = time.monotonic()
        self.latency_task = asyncio.create_task(self._latency(client, w))

    async def _latency(self, client: httpx.AsyncClient, w: prom.Windows) -> None:
        t0 = time.monotonic()
        timeout = max(30.0, self.timeout)
        try:
            docs = await asyncio.gather(
                *(
                    self._get(client, "/api/v1/query", {"query": q}, timeout)
                    for q in prom.latency_queries(self.job, w)
                )
            )
            result = [item for doc in docs for item in prom.data_of(doc, "vector")]
            groups = prom.group_results(result, self.job)
        except _ERRORS as exc:
            self.latency_error = f"latency query: {type(exc).__name__}: {exc}"[:300]
        else:
            with self.lock:
                self.latency = {k: d.scalars for k, d in groups.items()}
            self.latency_error = None
        self.latency_s = time.monotonic() - t0
        self.refresh()  # the next poll uses them now

    async def _poll(self, client: httpx.AsyncClient) -> None:
        t0 = time.monotonic()
        try:
            tdoc, vector, matrix = await self._fetch(client)
            found = prom.parse_targets(tdoc)
        except _ERRORS as exc:
            with self.lock:
                self.error = f"{type(exc).__name__}: {exc}"[:300]
                self.hint = prom_view.fleet_hint(self.url, self.job, self.error, [], {}, set())
            return
        self._apply(found, vector, matrix, time.time())
        self.poll_s = time.monotonic() - t0

    def _apply(self, found: list, vector: list, matrix: list, now: float) -> None:
        data = prom.group_results(vector, self.job)
        points = prom.stall_points(matrix, self.job)
        chosen, health = prom_view.select(found, self.job, prom.jobs_with_vllm(data))
        self.scrape_s = prom_view.scrape_interval(chosen, self.settings.interval_s)
        jobs = {t.job for t in found}
        latency_known = self.latency_task is not None and self.latency_task.done()
        with self.lock:
            self.error = None
            self.hint = prom_view.fleet_hint(self.url, self.job, None, chosen, health, jobs)
            self.hint = self.hint or self.alerts_error  # rows keep the last alerts they had
            kept: dict[str, prom_view.PromEndpoint] = {}
            for t in chosen:
                ep = self.endpoints.get(t.url) or prom_view.PromEndpoint(t, self.settings)
                key = (t.job, t.instance)
                d = data.get(key)
                d = d.with_scalars(self.latency.get(key)) if d is not None else None
                poll = prom_view.PromPoll(t, health.get(t.url), d, points.get(key, {}), now)
                ep.observe(poll)
                ep.view = prom_alerts.with_alerts(ep.view, t.instance, self.alerts)
                probe = self.probes.get(t.instance)
                ep.view = prom_view.with_probe(ep.view, probe, CANARY_JOB)
                kept[t.url] = ep
            self.endpoints = kept  # a target Prometheus dropped leaves the fleet
            self.polls += 1
            self.complete = self.complete or latency_known

    # ---- the interface ---------------------------------------------------------------------
    def collect(self) -> FleetSnapshot:
        """The current FleetSnapshot: every endpoint's view and the fleet's hint."""
        with self.lock:
            views = tuple(ep.view for ep in self.endpoints.values())
            hint = self.hint
        interval = self.data_interval
        return FleetSnapshot(time.time(), views, interval, self.name, self.paused, hint)

    def series(self, url: str, name: str) -> list[float]:
        """The bounded history of one figure of one endpoint ([] for an unknown URL)."""
        with self.lock:
            ep = self.endpoints.get(url)
            return ep.series(name) if ep else []

    def wait_settled(self, timeout: float) -> bool:
        """Wait until a poll brought latency and every endpoint was scraped.

        Scraped with rates, where it is a live vLLM server; False on the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                views = [ep.view for ep in self.endpoints.values()]
                polled = self.complete
            if polled and all(prom_view.settled(v) for v in views):
                return True
            time.sleep(0.05)
        return False
