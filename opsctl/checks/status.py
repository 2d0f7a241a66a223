"""`opsctl status` as a library call: one scrape of one running vLLM server.

``run(UrlTarget, Options, progress, session) -> Report`` (schema ``status/3``) polls the
server once with the console's collector (:func:`opsctl.collectors.scrape.scrape_once`:
/health and /metrics, then /version, /v1/models and /server_info, each under its own
deadline) and decides with the console's domain (:mod:`opsctl.console.judge`): the
endpoint state and its reason, and the key figures of that one /metrics body (rates need
two scrapes: ``opsctl console --once`` has them). The target's ``api_key`` is sent as a
bearer token. Status only looks at a running server, so it never uses ``session``.

Like ``systemctl status``, the report always describes the state it found, a dead or
missing server included: ``state`` is one of the console's states (ready, busy, dead,
unreachable, unauthorized), ``reason`` says why when not ready/busy and ``error`` holds
the failure opsctl met (null when none), ``timed_out`` whether a request ran past the
timeout (no answer in time: a server that answered /health then gave no /metrics, or
one that accepted the connection and never answered, e.g. its API server stopped).
:func:`exit_code` maps it: 0 ready/busy, 1 any other answer from a vLLM server (e.g.
/health 503), 4 timed out after /health answered (the server was there), 3 when no
vLLM server answered (refused, connect or read timeout -- ``timed_out`` true --, a
non-vLLM HTTP server: "not a vLLM server") or the API key was refused ("authentication
required"). Only a bad URL raises (BadInput, 2).

A server of several data-parallel engines (vLLM's ``engine`` label) is judged engine by
engine with the console's rule: the busy engines watched until each moves or the stall
window passes flat, the idle ones each sent a canary of their own
(``X-data-parallel-rank``); ``engines`` lists each with its state, figures and canary
(one entry for a single-engine server); the server is stalled when any engine is and
the reason names it (``engine 1 (EngineCore_DP1): ...``).

``vllm_version`` is the server's /version; ``platform`` what vLLM's ``current_platform``
reported (from /server_info when exposed, else the patch ledger when opsctl started the
server), null when unknown.

Example::

    from opsctl.checks import status
    from opsctl.checks.target import UrlTarget
    report = status.run(UrlTarget("http://127.0.0.1:8000"), status.Options(timeout=2))
    print(report.verdict, report.to_dict()["state"], status.exit_code(report))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, PASS, Report
from opsctl.checks.target import UrlTarget
from opsctl.exit_codes import ExitCode

if TYPE_CHECKING:
    from opsctl.checks.session import EngineSession

# /1: the key metrics of a one-off /metrics read; /2: the server version as a field;
# /3: a document whatever the state (unreachable included, with `error`), `version`
# dropped (one name per fact: `vllm_version`), `platform` null when unknown; later,
# within /3 (optional fields): `canary`, `stopped_processes` and `engines` (each
# data-parallel engine judged on its own); `timed_out` also when no answer came in time
SCHEMA = "status/3"
NO_ANSWER = ("unreachable", "unauthorized")  # no vLLM server answered us: exit 3


@dataclass(frozen=True, slots=True)
class Options:
    """The waits of ``opsctl status``, its canary, and whether to look at local processes."""

    timeout: float = 5.0  # seconds, for each HTTP request
    # the canary's deadline (a 1-token completion sent to a ready or busy server, whose
    # gauges cannot show a stopped engine); None: no canary
    canary_timeout: float | None = 10.0
    local: bool = True  # look at the server's local processes (stopped ones: stalled)
    # a busy server is watched this long for progress before it is called stalled (the
    # console's --stall-window default)
    stall_window: float = 10.0


def run(
    target: UrlTarget,
    options: Options = Options(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> Report:
    """The health, state and key metrics of the server at ``target``."""
    from opsctl.collectors.scrape import scrape_once
    from opsctl.console.judge_state import (
        BUSY,
        READY,
        STALLED,
        decide,
        judge_canary,
        with_stopped,
    )
    from opsctl.domain.urls import normalise_url
    from opsctl.output import document

    base = normalise_url(target.url)
    progress(ev.Phase(f"scraping {base}"))
    scrape = scrape_once(base, api_key=target.api_key, timeout=options.timeout)
    pid = server_pid(base) if options.local else None
    local = _local(pid)
    engines = with_stopped(_engines_of(scrape), local)
    state, reason = decide(scrape, local, None, False, engines)
    canary = None
    models = [m.id for m in scrape.info.models] if scrape.info else []
    if len(engines) > 1 and state in (READY, BUSY):  # each data-parallel engine on its own
        state, reason, engines = _judge_engines(scrape, local, base, target, options, progress)
    elif state == BUSY:
        progress(ev.Phase(f"requests running: progress watched up to {options.stall_window:g} s"))
        flat = _flat_for(scrape, base, target, options)
        if flat is not None:  # the console's rule: requests running, nothing moved
            state, reason = STALLED, _flat_reason(scrape, flat, options.stall_window)
    elif options.canary_timeout and state == READY and models:
        from opsctl.collectors.canary import send

        progress(ev.Phase(f"canary: a 1-token completion to {models[0]}"))
        canary = send(base, models[0], options.canary_timeout, target.api_key)
        state, reason = judge_canary(state, reason, canary.ok, canary.detail)
    if len(engines) == 1 and state in (READY, BUSY, STALLED):  # one engine: the server's
        engines = (replace(engines[0], state=state, reason=reason),)
    late = _late(scrape, options.timeout)
    if late is not None and state == "unreachable":  # a server answered, then went quiet
        reason = late
    death = _first_death(base) if options.local else None
    if death is not None and state in ("dead", "unreachable"):  # the rank that died first
        reason = f"{death.summary()}; {reason}" if reason else death.summary()
    info = scrape.info
    healthy = scrape.health.status == 200 and state in (READY, BUSY)
    doc = document(
        SCHEMA,
        url=base,
        state=state,
        reason=reason,
        error=f"{base}: {late}" if late else _error(base, state, reason, scrape),
        timed_out=late is not None or _timed_out(scrape),
        healthy=healthy,
        health_status=scrape.health.status,
        vllm_version=info.version if info else None,
        platform=_platform(base, info.server_info if info else None),
        models=[m.id for m in info.models] if info else [],
        metrics=_metrics(scrape.samples) if scrape.samples is not None else None,
        metrics_error=None if scrape.samples is not None else _metrics_error(scrape.metrics),
        canary=canary.to_dict() if canary else None,
        engines=[e.to_dict() for e in engines],
        stopped_processes=[
            {"pid": p.pid, "role": p.role} for p in (local.stopped if local else ())
        ],
        processes=_processes(pid),
        first_death=death.to_dict() if death is not None else None,
    )
    verdict = PASS if healthy else FAIL
    progress(ev.Finished(verdict, f"{state}: {reason}" if reason else state))
    return Report(verdict, doc)


def _first_death(base: str):
    """The rank that died first in the newest opsctl run at ``base`` (None: none, or a
    server opsctl did not start; opsctl.collectors.deaths)."""
    from opsctl.collectors.deaths import of_url

    try:
        return of_url(base)
    except (OSError, ValueError):
        return None


def exit_code(report: Report) -> ExitCode:
    """The exit code of a status report.

    0 healthy, 4 a server answered /health and then not within the timeout, 3 no vLLM
    server answered (or the key was refused; also when no answer came in time: then
    ``timed_out`` is true too), 1 otherwise."""
    doc = report.document
    if doc["timed_out"] and doc["health_status"] is not None:
        return ExitCode.TIMEOUT
    if report.document["state"] in NO_ANSWER:
        return ExitCode.UNREACHABLE
    return ExitCode.OK if report.passed else ExitCode.CHECK_FAILED


def error_of(report: Report, api_key: str | None = None) -> tuple[str, str | None] | None:
    """The one stderr line (and hint) for a report that did not pass, else None."""
    from opsctl.collectors.http import auth_error

    doc = report.document
    if report.passed:
        return None
    if doc["state"] == "unauthorized":
        return str(doc["error"]), auth_error(doc["url"], 401, api_key).hint
    return str(doc["error"] or f"{doc['url']} is {doc['state']}: {doc['reason']}"), None


PROGRESS_LOOK_S = 1.0  # a busy server is looked at again after this long


def _flat_reason(scrape, flat: float, window: float) -> str:
    running = scrape.samples.get("vllm:num_requests_running") if scrape.samples else 0
    return (
        f"{running or 0:.0f} requests running, generation, engine steps and KV cache flat "
        f"for {flat:.0f} s (stall window {window:g} s); /health {scrape.health.status}"
    )


def _flat_for(scrape, base: str, target: UrlTarget, options: Options) -> float | None:
    """Seconds a busy server's progress stayed flat: None once it moved.

    Progress is the console's (a generated token, an engine step or a change of the KV
    cache's usage), watched as ``console --once`` does: a scrape a second until it
    moves (busy; a long prefill moves only the KV cache, slowly) or the stall window
    passes with it flat (stalled). No canary for a busy server: it would wait behind the
    running requests (a prefill takes the whole token budget) and read slow as stalled.
    """
    import time

    from opsctl.collectors.scrape import scrape_once
    from opsctl.domain.metrics import STALL_SERIES

    def progress(samples) -> tuple[float | None, ...]:
        return tuple(samples.get(n) if samples else None for n in STALL_SERIES[1:])

    before, t0 = progress(scrape.samples), time.monotonic()
    while time.monotonic() - t0 < options.stall_window:
        time.sleep(min(PROGRESS_LOOK_S, max(0.0, options.stall_window - (time.monotonic() - t0))))
        again = scrape_once(base, api_key=target.api_key, timeout=options.timeout)
        if again.samples is None:
            return None  # it stopped answering: not this rule's call
        if progress(again.samples) != before:
            return None
    return time.monotonic() - t0


def _engines_of(scrape) -> tuple:
    """The scrape's data-parallel engines: busy or ready by their gauges; () without."""
    from opsctl.console.judge import engine_readings
    from opsctl.console.judge_state import EngineProgress, judge_engines

    if scrape.samples is None:
        return ()
    return judge_engines(engine_readings(scrape.samples, None, None), EngineProgress(), 0.0)


def _judge_engines(scrape, local, base: str, target: UrlTarget, options: Options, progress):
    """(state, reason, engines) of a server of several data-parallel engines.

    Each engine by the console's rule (opsctl.console.judge_state.judge_engines): the
    busy ones watched a scrape a second until each moved or the stall window passed flat
    (stalled); then the idle ones, whose gauges cannot vouch for them, each get a canary
    sent to it alone (``X-data-parallel-rank``). The server is stalled when any engine is."""
    from opsctl.console.judge_state import decide, engine_canaries, with_stopped

    engines = _engines_of(scrape)
    if any(e.running for e in engines):
        progress(
            ev.Phase(f"requests running: each engine watched up to {options.stall_window:g} s")
        )
        scrape, engines = _watch_engines(scrape, base, target, options)
    engines = with_stopped(engines, local)
    state, reason = decide(scrape, local, None, False, engines)
    model = scrape.info.models[0].id if scrape.info and scrape.info.models else None
    idle = [e.engine for e in engines if e.state == "ready"]
    if options.canary_timeout and model and idle and state in ("ready", "busy"):
        from opsctl.collectors.canary import send_each

        progress(ev.Phase(f"canary: a 1-token completion to each idle engine ({', '.join(idle)})"))
        results = send_each(base, model, options.canary_timeout, target.api_key, idle)
        health = scrape.health.status
        state, reason, engines = engine_canaries(state, reason, engines, health, results)
    return state, reason, engines


def _watch_engines(scrape, base: str, target: UrlTarget, options: Options):
    """(last scrape, judged engines): each busy engine watched until it moved or the
    stall window passed with it flat (the console's rule, engine by engine)."""
    import time

    from opsctl.collectors.scrape import scrape_once
    from opsctl.console.judge import engine_readings
    from opsctl.console.judge_state import EngineProgress, engine_points, judge_engines

    memory = EngineProgress()
    memory.feed(engine_points(scrape.samples, scrape.finished_at))
    busy = {e.engine for e in engine_readings(scrape.samples, None, None) if e.running}
    moved: set[str] = set()
    last, prev, t0 = scrape, scrape, time.monotonic()
    while busy - moved and time.monotonic() - t0 < options.stall_window:
        time.sleep(min(PROGRESS_LOOK_S, max(0.0, options.stall_window - (time.monotonic() - t0))))
        again = scrape_once(base, api_key=target.api_key, timeout=options.timeout)
        if again.samples is None:
            break  # it stopped answering: not this rule's call
        memory.feed(engine_points(again.samples, again.finished_at))
        moved |= {e for e in busy if memory.moved_engine(e)}
        prev, last = last, again
    watched = time.monotonic() - t0
    dt = last.finished_at - prev.finished_at if last is not prev else None
    readings = engine_readings(last.samples, prev.samples if last is not prev else None, dt)
    # flat for the whole look, which lasted the window (by the clock its scrapes read a
    # little less when a scrape ended early): stalled
    window = options.stall_window
    if watched >= window:
        window = min(window, last.finished_at - scrape.finished_at)
    return last, judge_engines(readings, memory, window)


def server_pid(url: str) -> int | None:
    """The pid of the local process serving ``url``.

    Its opsctl run's, else the one listening on its port; None for another host's server
    or none found."""

    from opsctl.collectors.processes import listening_pid
    from opsctl.collectors.runs import find_run_dir
    from opsctl.domain.urls import loopback_port

    port = loopback_port(url)
    if not port:
        return None
    from opsctl.collectors.jsonfile import run_meta

    pid = run_meta(find_run_dir(url)).get("pid")
    return pid if isinstance(pid, int) else listening_pid(port)


def _local(pid: int | None):
    """The server's stopped processes (they make it stalled), as a LocalState; None
    when none is stopped or there is no local process."""
    from opsctl.collectors.processes import stopped_members
    from opsctl.console.judge import LocalState

    stopped = stopped_members(pid) if pid else ()
    # only stopped processes add to what HTTP says (a server not answering stays
    # unreachable, exit 3, as before: status judges by its answers otherwise)
    return LocalState(True, stopped=stopped) if stopped else None


def _processes(pid: int | None) -> list[dict[str, Any]]:
    """Every process of a local server's tree with its role (empty for a remote one)."""
    from opsctl.collectors.processes import process_roles

    return [{"pid": p.pid, "role": p.role} for p in process_roles(pid)] if pid else []


def _late(scrape: Any, timeout: float) -> str | None:
    """/health answered but /metrics did not within ``timeout``: a server that is there
    and working (exit 4), not a missing one."""
    health, metrics = scrape.health.status, scrape.metrics
    if health is None or metrics.status is not None or not metrics.error:
        return None
    if "timed out" not in metrics.error and "Timeout" not in metrics.error:
        return None
    return f"/metrics gave no answer within {timeout:g} s (/health answered HTTP {health})"


def _timed_out(scrape: Any) -> bool:
    """Whether a request of the look ran past the timeout (no answer in time).

    A server that accepts and never answers (its API server stopped, a host that holds
    the connection) reads "timed out" in the error: ``timed_out`` says the same (issue
    45 item 5: the two disagreed)."""
    errors = (scrape.health.error or "", scrape.metrics.error or "")
    return any("timed out" in e or "Timeout" in e for e in errors)


def _error(base: str, state: str, reason: str | None, scrape: Any) -> Any:
    auth = scrape.auth
    if auth is not None and auth.status is not None:
        return f"authentication required: {base} answered HTTP {auth.status}"
    if scrape.health.status is None:
        return f"no server answered at {base}: {scrape.health.error}"
    if state == "unreachable":
        return f"not a vLLM server at {base} {(reason or '').removeprefix('not a vLLM server ')}"
    if scrape.health.status != 200:
        return f"{base}/health answered HTTP {scrape.health.status}"
    return None


def _platform(url: str, server_info: Any) -> str | None:
    """/server_info's device type, else the ledger of the run that started ``url``;
    None when neither tells."""
    from opsctl.collectors.engine_records import identity
    from opsctl.collectors.runs import find_run_dir
    from opsctl.domain import platform as plat

    return plat.from_server_info(server_info) or identity(find_run_dir(url))[0] or None


def _metrics(samples: Any) -> dict[str, Any]:
    """The figures one /metrics body gives (gauges, totals, lifetime latencies)."""
    from opsctl.console.judge import figures

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
