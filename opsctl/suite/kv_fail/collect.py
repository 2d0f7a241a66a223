"""I/O of ``diag kv-fail`` against the engine opsctl started with the faulty KV connector.

Completions over HTTP, the connector's control file, its event files and the patch's, the server
log, /metrics, and whether the engine still lives.

:class:`KvProbe` holds one HTTP client for one engine. Every wait here is a condition
with a deadline (:meth:`KvProbe.still_alive`, :meth:`KvProbe.log_until`); nothing
sleeps a fixed time. What it reads comes back as frozen records of
:mod:`opsctl.suite.kv_fail.judge` (or plain dicts for the engine's own records).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from engine_patches.connectors.injection import (
    CONTROL_FILE,
    INJECTIONS,
    STORE_DIR,
    TRANSFERS,
    InjectionPlan,
    control_text,
)
from opsctl.collectors import http, ledger
from opsctl.collectors.metrics import MetricsSnapshot, fetch_metrics
from opsctl.suite.kv_fail import judge

RECOVERIES = "kv_recoveries"  # written by engine_patches.patches.kv_hybrid_recompute
POLL = 0.1  # seconds between looks while waiting for a condition


def write_control(store: Path, plan: InjectionPlan) -> None:
    """Give the running connector a new plan, atomically.

    It never reads half a file; it compares content, so two writes within one mtime tick both
    count."""
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".{CONTROL_FILE}.tmp"
    tmp.write_text(control_text(plan))
    tmp.replace(store / CONTROL_FILE)


def complete(
    client: httpx.Client,
    url: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    timeout: float,
    api_key: str | None = None,
) -> judge.Output:
    """One greedy completion of token ids with their logprobs.

    A transport error is an output that failed (with the reason), a refused credential the
    typed error."""
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    try:
        r = client.post(f"{url}/v1/completions", json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        return judge.Output(False, error=f"{type(exc).__name__}: {exc}"[:200])
    http.check_auth(r, api_key)
    try:
        data = r.json()
    except ValueError:
        data = r.text
    return judge.output_from_response(r.status_code, data)


class EventTail:
    """The events of one kind that appeared since the last look.

    The files only grow; the first look returns what came after the tail was made."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._seen: Counter[str] = Counter(
            {kind: len(ledger.read_events(run_dir, kind)) for kind in (INJECTIONS, RECOVERIES)}
        )

    def new(self, kind: str) -> list[dict]:
        """The events of ``kind`` written since the last look."""
        events = ledger.read_events(self.run_dir, kind)
        fresh = events[self._seen[kind] :]
        self._seen[kind] = len(events)
        return fresh

    def injections(self) -> tuple[judge.Injection, ...]:
        """The connector's injections recorded since the last look."""
        return tuple(judge.Injection.from_event(e) for e in self.new(INJECTIONS))

    def recoveries(self) -> tuple[judge.Recovery, ...]:
        """The patch's recoveries recorded since the last look."""
        return tuple(judge.Recovery.from_event(e) for e in self.new(RECOVERIES))


class KvProbe:
    """One engine opsctl started, for one run of the kv-fail check.

    One engine (a :class:`opsctl.checks.target.Live` that opsctl started: ``server``
    is its EngineServer, ``run_dir`` its run directory) for one run of the check.

    An engine may serve several runs (an engine session reuses it): a probe starts with
    an empty KV store, so its first phase stores again, and it reads only the connector's
    and the patch's events that came after it was made."""

    def __init__(self, url: str, run_dir: Path, server: Any, api_key: str | None = None):
        self.url, self.run_dir, self.server, self.api_key = url, run_dir, server, api_key
        self.store = run_dir / STORE_DIR
        self._clear_store()
        kinds = (INJECTIONS, TRANSFERS, RECOVERIES)
        self._from = {kind: len(ledger.read_events(run_dir, kind)) for kind in kinds}
        self.client = http.client(api_key)
        self.tail = EventTail(run_dir)

    def _clear_store(self) -> None:
        """Forget the KV an earlier run on this engine stored (the control file stays)."""
        if not self.store.is_dir():
            return
        for entry in self.store.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)

    def _events(self, kind: str) -> list[dict]:
        return ledger.read_events(self.run_dir, kind)[self._from[kind] :]

    def close(self) -> None:
        """Close the probe's HTTP client."""
        self.client.close()

    def __enter__(self) -> KvProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- requests ------------------------------------------------------------------
    def set_plan(self, plan: InjectionPlan) -> None:
        """Write ``plan`` to the connector's control file."""
        write_control(self.store, plan)

    def complete(
        self, model: str, prompt: Sequence[int], max_tokens: int, timeout: float
    ) -> judge.Output:
        """One greedy completion of ``prompt`` (token ids) from this engine."""
        return complete(self.client, self.url, model, prompt, max_tokens, timeout, self.api_key)

    def metrics(self) -> MetricsSnapshot:
        """The engine's /metrics now."""
        return fetch_metrics(self.client, self.url)

    # ---- liveness ------------------------------------------------------------------
    def alive(self) -> bool:
        """Whether the engine process runs and /health answers."""
        return self.server.exited() is None and self.server.health(self.client)

    def still_alive(self, settle: float) -> bool:
        """After a failed request: is the engine still serving?

        A dead EngineCore makes /health fail (or the server exit) within moments; look again
        until ``settle`` seconds have passed."""
        deadline = time.monotonic() + settle
        while not self.alive():
            if time.monotonic() > deadline or self.server.exited() is not None:
                return False
            time.sleep(POLL)
        return True

    # ---- the server log --------------------------------------------------------------
    def log_text(self) -> str:
        """The engine's server log so far."""
        return self.server.log_text()

    def log_mark(self) -> int:
        """A mark at the log's current end, for :meth:`log_until`."""
        return len(self.log_text())

    def log_until(self, mark: int, done: Callable[[str], bool], timeout: float) -> str:
        """The log since ``mark``, once ``done(text)`` holds, the engine is gone or time is up.

        Time is up after ``timeout`` seconds; vLLM's lines land a moment after the answer."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text()[mark:]
            if done(text) or time.monotonic() > deadline or not self.alive():
                return text
            time.sleep(POLL)

    # ---- what the engine recorded ------------------------------------------------------
    def engine_info(self) -> dict:
        """The engine_info probe's last record (EngineCore config); ``{}`` when none."""
        return (ledger.read_events(self.run_dir, "engine_info") or [{}])[-1]

    def records(self) -> list[dict]:
        """The patch ledger records of the engine's processes."""
        return ledger.read_records(self.run_dir)

    def injections(self) -> tuple[judge.Injection, ...]:
        """The connector's injections since this probe was made."""
        return tuple(judge.Injection.from_event(e) for e in self._events(INJECTIONS))

    def transfers(self) -> tuple[judge.Transfer, ...]:
        """The connector's KV transfers since this probe was made."""
        return tuple(judge.Transfer.from_event(e) for e in self._events(TRANSFERS))

    def recoveries(self) -> tuple[judge.Recovery, ...]:
        """The patch's recoveries since this probe was made."""
        return tuple(judge.Recovery.from_event(e) for e in self._events(RECOVERIES))
