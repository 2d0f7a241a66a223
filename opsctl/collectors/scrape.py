"""Asynchronous scraping of vLLM OpenAI servers: one poll of one endpoint reads /health
and /metrics concurrently (and, when asked, /version, /v1/models and /server_info),
each under its own deadline, so a server that accepts and never answers costs its own
row a timeout and nobody else anything. Returns frozen Scrape snapshots (domain types).

/metrics is read by a targeted tokenizer of the families the console reads
(opsctl.domain.metrics_fast), proven equal to prometheus_client's parser
(opsctl.domain.metrics.parse_samples) on recorded real bodies and falling back to it on
anything unusual. A body whose vLLM lines did not change since the previous poll is not
parsed again, and of a changed body only the changed lines are tokenized.

One-shot use (what ``opsctl status`` can call)::

    scrape = scrape_once("http://127.0.0.1:8000", api_key=None, timeout=5.0)
"""

from __future__ import annotations

import asyncio
import ssl
import time

import httpx

from opsctl.collectors import http
from opsctl.domain import metrics_fast
from opsctl.domain.console import EngineInfo, HttpStatus, ModelInfo, Scrape
from opsctl.domain.metrics import MetricSamples, parse_samples

AUTH_STATUSES = (401, 403)


_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client: building one loads the CA store (~60 ms of CPU),
    which per endpoint made a 256-endpoint console spend seconds just starting."""
    global _SSL
    if _SSL is None:
        _SSL = ssl.create_default_context()
    return _SSL


def new_client(api_key: str | None = None, timeout: float = 2.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=timeout,
        headers=http.headers(api_key),
        limits=http.limits(8, 4),
        verify=_ssl_context(),
    )


async def _get(
    client: httpx.AsyncClient, url: str, path: str, timeout: float, headers: dict | None
) -> tuple[HttpStatus, httpx.Response | None]:
    t0 = time.monotonic()
    try:
        r = await asyncio.wait_for(client.get(url + path, headers=headers), timeout)
    except TimeoutError:
        return HttpStatus(path, None, f"timed out after {timeout:g} s", timeout), None
    except httpx.HTTPError as exc:
        text = str(exc) or type(exc).__name__
        return HttpStatus(path, None, f"{type(exc).__name__}: {text}"[:200]), None
    return HttpStatus(path, r.status_code, None, time.monotonic() - t0), r


class MetricsCache:
    """One endpoint's parsed /metrics: an unchanged body (an idle server's vLLM lines) is
    not parsed again; of a changed one (counters moving under load) only the lines that
    changed since the previous poll are tokenized."""

    def __init__(self) -> None:
        self.lines: list[str] | None = None
        self.series = 0
        self.samples: MetricSamples | None = None
        self.tokens: dict[str, metrics_fast.Prepared] = {}

    def parse(self, text: str) -> MetricSamples:
        lines, series = metrics_fast.scan(text)
        if self.samples is not None and lines == self.lines and series == self.series:
            return self.samples
        known, fresh = self.tokens, {}
        try:
            for line in lines:
                tok = known.get(line)
                fresh[line] = tok if tok is not None else metrics_fast.prepare(line)
            samples = metrics_fast.build_prepared([fresh[line] for line in lines], series)
        except ValueError:  # a line the tokenizer does not handle: the reference parser
            samples, fresh = parse_samples(text), {}
        self.lines, self.series, self.samples, self.tokens = lines, series, samples, fresh
        return samples


def _json(r: httpx.Response | None) -> dict | None:
    if r is None or r.status_code != 200:
        return None
    try:
        doc = r.json()
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _models(doc: dict | None) -> tuple[ModelInfo, ...]:
    out = []
    for m in (doc or {}).get("data", []) or []:
        if isinstance(m, dict) and "id" in m:
            mml = m.get("max_model_len")
            out.append(
                ModelInfo(str(m["id"]), mml if isinstance(mml, int) else None, m.get("root"))
            )
    return tuple(out)


async def fetch_info(
    client: httpx.AsyncClient, url: str, timeout: float, headers: dict | None = None
) -> tuple[EngineInfo, HttpStatus | None]:
    """/version, /v1/models and /server_info concurrently; the second value is a
    401/403 answer if any path gave one. ``fetched_at`` is None unless every path got an
    HTTP answer: a timed-out /version (a starved server) is asked again at the next poll,
    not a minute later."""
    paths = ("/version", "/v1/models", "/server_info")
    results = await asyncio.gather(*(_get(client, url, p, timeout, headers) for p in paths))
    auth = next((st for st, _ in results if st.status in AUTH_STATUSES), None)
    version = (_json(results[0][1]) or {}).get("version")
    info = EngineInfo(
        version=str(version) if version is not None else None,
        models=_models(_json(results[1][1])),
        server_info=_json(results[2][1]),
        fetched_at=time.time() if all(st.status is not None for st, _ in results) else None,
    )
    return info, auth


async def scrape(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout: float = 2.0,
    want_info: bool = False,
    cache: MetricsCache | None = None,
    headers: dict | None = None,
) -> Scrape:
    """One poll of one endpoint (never raises for HTTP trouble: it is in the snapshot)."""
    started = time.time()
    cache = cache or MetricsCache()
    jobs = [
        _get(client, url, "/health", timeout, headers),
        _get(client, url, "/metrics", timeout, headers),
    ]
    (health, _), (metrics, mr) = await asyncio.gather(*jobs)
    auth = next((st for st in (health, metrics) if st.status in AUTH_STATUSES), None)
    samples = None
    if mr is not None and mr.status_code == 200:
        try:
            samples = cache.parse(mr.text)
        except ValueError as exc:  # not Prometheus text
            metrics = HttpStatus("/metrics", mr.status_code, f"unparsable: {exc}"[:200])
    info = None
    if want_info and health.status is not None:
        info, info_auth = await fetch_info(client, url, timeout, headers)
        auth = auth or info_auth
    return Scrape(url, started, time.time(), health, metrics, samples, info, auth)


def scrape_once(url: str, api_key: str | None = None, timeout: float = 5.0) -> Scrape:
    """A single-endpoint, one-shot poll with engine info (for one-shot commands)."""

    async def run() -> Scrape:
        async with new_client(api_key, timeout) as client:
            return await scrape(client, url.rstrip("/"), timeout=timeout, want_info=True)

    return asyncio.run(run())
