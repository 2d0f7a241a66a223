"""Asynchronous scraping of vLLM OpenAI servers: /health and /metrics under one deadline.

One poll of one endpoint reads /health then /metrics on one kept connection under one deadline
(and, when asked, /version, /v1/models and /server_info under another), so a server that accepts
and never answers costs its own row a timeout and nobody else anything. Returns frozen Scrape
snapshots (domain types). ``Poller`` is one endpoint's client: opsctl.collectors.fastget (a
minimal keep-alive HTTP/1.1 GET) for plain http URLs, httpx for anything else.

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
import contextlib
import functools
import ssl
import time

import httpx

from opsctl.collectors import fastget, http
from opsctl.console.judge import EngineInfo, HttpStatus, ModelInfo, Scrape
from opsctl.domain import metrics, metrics_fast
from opsctl.domain.metrics import MetricSamples, parse_samples

AUTH_STATUSES = (401, 403)
_POLL_PATHS = ("/health", "/metrics")  # one poll of one endpoint, in this order


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client: building one loads the CA store (~60 ms of CPU),
    which per endpoint made a 256-endpoint console spend seconds just starting."""
    return ssl.create_default_context()


def new_client(api_key: str | None = None, timeout: float = 2.0) -> httpx.AsyncClient:
    """An httpx async client for scraping, with the API key and the shared TLS context."""
    return httpx.AsyncClient(
        timeout=timeout,
        headers=http.headers(api_key),
        limits=http.limits(8, 4),
        verify=_ssl_context(),
    )


def _getter(client, url: str, headers: dict | None):
    """``get(path)`` on either client kind (the fast one knows its base URL and headers)."""
    if isinstance(client, fastget.Client):
        return client.get
    return lambda path: client.get(url + path, headers=headers)


async def _get(get, path: str) -> tuple[HttpStatus, httpx.Response | fastget.Response | None]:
    """One GET; HTTP trouble is in the status (no deadline here: the caller's)."""
    t0 = time.monotonic()
    try:
        r = await get(path)
    except (httpx.HTTPError, fastget.HTTPError) as exc:
        text = str(exc) or type(exc).__name__
        return HttpStatus(path, None, f"{type(exc).__name__}: {text}"[:200]), None
    return HttpStatus(path, r.status_code, None, time.monotonic() - t0), r


async def _get_all(get, paths: tuple[str, ...], timeout: float) -> list:
    """The paths one after the other on one deadline (one ``asyncio.timeout``, no task per
    request); what answered before the deadline is kept, the rest reads "timed out"."""
    out: list = []
    try:
        async with asyncio.timeout(timeout):
            for path in paths:
                out.append(await _get(get, path))
    except TimeoutError:
        pass
    for path in paths[len(out) :]:
        out.append((HttpStatus(path, None, f"timed out after {timeout:g} s", timeout), None))
    return out


_OTHER, _VLLM = False, True  # what MetricsCache.seen holds for lines it does not prepare
# line breaks str.splitlines() knows besides "\n" (metrics_fast.scan splits with it): a
# body holding one takes metrics_fast.scan's path (vLLM writes "\n" only)
_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


class MetricsCache:
    """One endpoint's parsed /metrics, re-parsing only what changed since the last poll.

    One endpoint's parsed /metrics: an unchanged body (an idle server's) is not parsed
    again; of a changed one (counters moving under load) only the lines that changed
    since the previous poll are looked at further than one dict lookup: ``seen`` maps
    each line of the previous body to its prepared sample (a wanted vllm: line), or to
    _VLLM (another vllm: line, counted) or _OTHER (comments, other families). The same
    lines and counts as metrics_fast.scan, so the same MetricSamples (the equality is
    tested against prometheus_client's parser)."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.prepared: list | None = None  # the wanted lines' samples, in body order
        self.series = 0
        self.samples: MetricSamples | None = None
        self.seen: dict[str, object] = {}
        self.repeats = False  # the previous scanned body repeated a line

    def parse(self, text: str) -> MetricSamples:
        """The samples of /metrics body ``text`` (the cached ones when it is unchanged)."""
        if self.samples is not None and text == self.text:  # the same body: ~2 us, no scan
            return self.samples
        try:
            changed: set[str] | None = None  # names whose samples changed; None: unknown
            if not any(b in text for b in _BREAKS):
                prepared, series, seen, changed = self._scan_cached(text)
            else:
                lines, series = metrics_fast.scan(text)
                prepared, seen = [metrics_fast.prepare(line) for line in lines], {}
            if self.samples is None or self.prepared is None:
                samples = metrics_fast.build_prepared(prepared, series)
            elif changed is None:
                same = prepared == self.prepared and series == self.series
                samples = self.samples if same else metrics_fast.build_prepared(prepared, series)
            elif not changed and series == self.series:
                samples = self.samples  # only lines the console does not read changed
            else:  # the changed names summed again, the rest kept
                samples = metrics_fast.build_changed(self.samples, prepared, changed, series)
        except ValueError:  # a line the tokenizer does not handle: the reference parser
            prepared, series = None, metrics_fast.scan(text)[1]
            samples, seen = parse_samples(text), {}
        self.prepared, self.series, self.samples, self.seen = prepared, series, samples, seen
        self.text = text
        return samples

    def _scan_cached(self, text: str):
        """metrics_fast.scan and prepare in one go: the body's lines looked up in ``seen``
        with C loops (split, set differences, map, zip, count), Python code only for the
        lines new since the previous poll and those gone. Returns (prepared wanted
        samples in body order, the count of vllm: lines, the new ``seen``, the names of
        the wanted samples whose lines came or went; None when the previous body was not
        scanned here, so nothing is known about what changed)."""
        lines = text.split("\n")
        known = self.seen
        wanted = metrics.wanted
        present = set(lines)
        # a repeated line (in this body or the previous): a set cannot tell its count
        # changed, so nothing is known about what changed
        repeats = len(lines) - len(present) > max(0, lines.count("") - 1)
        known_before = self.prepared is not None and known and not self.repeats
        changed: set[str] | None = set() if known_before and not repeats else None
        self.repeats = repeats
        for line in present.difference(known):
            if not line.startswith("vllm:"):
                known[line] = _OTHER
            elif wanted(line):
                known[line] = tok = metrics_fast.prepare(line)
                if changed is not None:
                    changed.add(tok[1])
            else:
                known[line] = _VLLM
        if changed is not None:
            for line in known.keys() - present:
                tok = known[line]
                if tok is not _OTHER and tok is not _VLLM:
                    changed.add(tok[1])  # type: ignore[index]
        toks = list(map(known.__getitem__, lines))
        prepared = [t for t in toks if t is not _OTHER and t is not _VLLM]
        seen = dict(zip(lines, toks, strict=True))
        return prepared, len(toks) - toks.count(_OTHER), seen, changed


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
    client: httpx.AsyncClient | fastget.Client,
    url: str,
    timeout: float,
    headers: dict | None = None,
) -> tuple[EngineInfo, HttpStatus | None]:
    """/version, /v1/models and /server_info on one deadline.

    The second value is a 401/403 answer if any path gave one. ``fetched_at`` is None unless
    every path got an HTTP answer: a timed-out /version (a starved server) is asked again at
    the next poll, not a minute later."""
    paths = ("/version", "/v1/models", "/server_info")
    results = await _get_all(_getter(client, url, headers), paths, timeout)
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
    client: httpx.AsyncClient | fastget.Client,
    url: str,
    *,
    timeout: float = 2.0,
    want_info: bool = False,
    cache: MetricsCache | None = None,
    headers: dict | None = None,
) -> Scrape:
    """One poll of one endpoint: /health then /metrics on one connection and one deadline.

    ``timeout`` for both; the engine facts, when asked, get their own, never raising for
    HTTP trouble: it is in the snapshot. ``fastget.Unsupported`` is raised for an answer the
    fast client does not handle (``Poller`` then uses httpx)."""
    started = time.time()
    cache = cache or MetricsCache()
    get = _getter(client, url, headers)
    (health, _), (metrics, mr) = await _get_all(get, _POLL_PATHS, timeout)
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


class Poller:
    """One endpoint's polls: the fast keep-alive client where it can, httpx otherwise.

    The fast client is opsctl.collectors.fastget; httpx takes over from the first answer the
    fast client does not handle. Use as an async context manager (closes the connections)."""

    def __init__(
        self, url: str, api_key: str | None = None, timeout: float = 2.0, *, fast: bool = True
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self.fast: fastget.Client | None = None
        if fast and fastget.usable(url):
            with contextlib.suppress(fastget.Unsupported):  # an odd path or key: httpx
                self.fast = fastget.Client(url, http.headers(api_key))
        self.slow: httpx.AsyncClient | None = None

    def _slow(self) -> httpx.AsyncClient:
        if self.slow is None:
            self.slow = new_client(self.api_key, self.timeout)
        return self.slow

    async def scrape(self, *, want_info: bool = False, cache: MetricsCache | None = None) -> Scrape:
        """One poll of the endpoint (by httpx from the first answer the fast client cannot read)."""
        if self.fast is not None:
            try:
                return await scrape(
                    self.fast, self.url, timeout=self.timeout, want_info=want_info, cache=cache
                )
            except fastget.Unsupported:
                await self.fast.aclose()
                self.fast = None
        return await scrape(
            self._slow(), self.url, timeout=self.timeout, want_info=want_info, cache=cache
        )

    async def aclose(self) -> None:
        """Close the endpoint's connections."""
        if self.fast is not None:
            await self.fast.aclose()
        if self.slow is not None:
            await self.slow.aclose()

    async def __aenter__(self) -> Poller:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def scrape_once(url: str, api_key: str | None = None, timeout: float = 5.0) -> Scrape:
    """A single-endpoint, one-shot poll with engine info (for one-shot commands)."""

    async def run() -> Scrape:
        async with Poller(url.rstrip("/"), api_key, timeout) as poller:
            return await poller.scrape(want_info=True)

    return asyncio.run(run())
