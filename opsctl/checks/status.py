"""`opsctl status` as a library call: one scrape of one running vLLM server.

``run(UrlTarget, Options, progress, session) -> Report`` (schema ``status/2``) polls the
server once with the console's collector (:func:`opsctl.collectors.scrape.scrape_once`:
/health and /metrics, then /version, /v1/models and /server_info, each under its own
deadline) and decides with the console's domain (:mod:`opsctl.domain.console`): the
endpoint state and its reason, and the key figures of that one /metrics body (rates need
two scrapes: ``opsctl console --once`` has them). The target's ``api_key`` is sent as a
bearer token. Status only looks at a running server, so it never uses ``session``.

``platform`` names what vLLM's ``current_platform`` reported: from the server's
/server_info when exposed (``VLLM_SERVER_DEV_MODE=1``), else from the patch ledger when
opsctl started the server, else "unknown (not started by opsctl)"; ``vllm_version``
repeats ``version`` under the name every diag report uses.

Verdict pass when /health answers 200, else fail. Nothing answering is
EngineUnreachable, a refused key "authentication required" (both exit 3).

Example::

    from opsctl.checks import status
    from opsctl.checks.target import UrlTarget
    report = status.run(UrlTarget("http://127.0.0.1:8000"), status.Options(timeout=2))
    print(report.verdict, report.to_dict()["version"], report.to_dict()["state"])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, PASS, Report
from opsctl.checks.target import UrlTarget

if TYPE_CHECKING:
    from opsctl.checks.session import EngineSession

SCHEMA = "status/2"  # /1: the key metrics of a one-off /metrics read; see the CHANGELOG


@dataclass(frozen=True, slots=True)
class Options:
    timeout: float = 5.0  # seconds, for each HTTP request


def run(
    target: UrlTarget,
    options: Options = Options(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> Report:
    from opsctl.collectors import http
    from opsctl.collectors.scrape import scrape_once
    from opsctl.domain.console_state import decide
    from opsctl.domain.urls import validate_url
    from opsctl.errors import EngineUnreachable
    from opsctl.output import document

    base = validate_url(target.url)
    progress(ev.Phase(f"scraping {base}"))
    scrape = scrape_once(base, api_key=target.api_key, timeout=options.timeout)
    if scrape.health.status is None:
        raise EngineUnreachable(f"no server answered at {base}: {scrape.health.error}")
    if scrape.auth is not None and scrape.auth.status is not None:
        raise http.auth_error(base, scrape.auth.status, target.api_key)
    state, reason = decide(scrape, None, None, False, False)
    info = scrape.info
    healthy = scrape.health.status == 200
    doc = document(
        SCHEMA,
        url=base,
        healthy=healthy,
        health_status=scrape.health.status,
        version=info.version if info else None,
        vllm_version=info.version if info else None,
        platform=_platform(base, info.server_info if info else None),
        models=[m.id for m in info.models] if info else [],
        state=state,
        reason=reason,
        metrics=_metrics(scrape.samples) if scrape.samples is not None else None,
        metrics_error=None if scrape.samples is not None else _metrics_error(scrape.metrics),
    )
    verdict = PASS if healthy else FAIL
    progress(ev.Finished(verdict, f"{state}: {reason}" if reason else state))
    return Report(verdict, doc)


def _platform(url: str, server_info: Any) -> str:
    """/server_info's device type, else the ledger of the run that started ``url``."""
    from opsctl.collectors.engine_records import identity
    from opsctl.collectors.runs import find_run_dir
    from opsctl.domain import platform as plat

    found = plat.from_server_info(server_info)
    return plat.label(found or identity(find_run_dir(url))[0])


def _metrics(samples: Any) -> dict[str, Any]:
    """The figures one /metrics body gives (gauges, totals, lifetime latencies)."""
    from opsctl.domain.console import figures

    f = figures(samples, None, None, None)
    ttft = f.latency.get("ttft")
    return {
        "requests_running": f.running,
        "requests_waiting": f.waiting,
        "kv_cache_usage": f.kv_usage,
        "prompt_tokens_total": f.prompt_tokens_total,
        "generation_tokens_total": f.generation_tokens_total,
        "ttft_mean_s": ttft.mean if ttft else None,
        "series": samples.vllm_series,
        "ttft_p50_s": ttft.p50 if ttft else None,
        "ttft_p95_s": ttft.p95 if ttft else None,
        "kv_capacity_tokens": f.kv_capacity_tokens,
        "kv_used_tokens": f.kv_used_tokens,
        "prefix_cache_hit_rate": f.prefix_hit_rate_lifetime,
        "requests_total": f.requests_total,
        "preemptions_total": f.preemptions_total,
        "engines": f.engines,
    }


def _metrics_error(st: Any) -> str:
    if st.error:
        return str(st.error)
    return f"{st.path} answered HTTP {st.status}"
