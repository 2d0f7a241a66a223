"""The console's JSON document (schema opsctl.console/3) and plain table.

Both from the same FleetSnapshot the TUI renders.

opsctl.console/2 (from /1): ``exit_code`` is 3 for an empty fleet (was 0: a gate that
checked nothing passed); new top-level ``reason`` (one line: why this exit code),
``stall_window_s`` and ``observed_s`` (how long ``--once`` watched: one interval for an
idle or progressing fleet, up to the stall window while an endpoint with requests running
had not been seen generating); an endpoint that answers HTTP but is not vLLM has the
reason "not a vLLM server (...)".

opsctl.console/3 (from /2): per endpoint ``findings``, the advisor's findings
(opsctl.console.judge_advisor; most severe first): ``code``, ``severity``, ``message``,
``figures`` (what triggered it; ``window_s`` the window it was taken over) and ``next``
(the command to run next). Per endpoint ``gpus``: the GPUs its local processes use
(opsctl.domain.gpu.device_dict: util, memory, temperature, power, fan, clocks, and
``processes`` with pid, role, used_bytes); top-level ``host``: ``gpus`` (every GPU of
the host), ``gpu_source`` (nvml, sysfs, null), ``gpu_reason`` ("no GPU (...)" when
none), ``gpu_driver``. Per endpoint ``tee`` (null unless ``--tee`` is on this server): its
``listen_url``, ``upstream_url``, ``keep_prompts``, ``requests_in_flight``,
``requests_seen``, ``requests_failed``, ``requests_disconnected`` and ``requests`` (in
flight oldest first, then finished newest first, 50 at most: ``endpoint``, ``model``,
``adapter``, ``stream``, ``status`` (HTTP code, ``disconnected``, ``upstream_error``;
null in flight), ``ttft_s``, ``duration_s``, ``prompt_tokens``, ``output_tokens``,
``tokens_from`` (``usage`` or ``chunks``), ``prompt`` (null unless kept)); per endpoint
``log`` (null unless ``--log``/a target's ``log``): ``path``, ``reason`` (why it could
not be read), ``size_bytes``, ``read_bytes``, ``rotations``, ``load_phase``,
``decisive_lines``, ``tail``. Per endpoint ``alerts`` (``console --prometheus``; [] for
other sources): the alerts firing for it in Prometheus (/api/v1/alerts, matched by the
``instance`` label), most severe first: ``alertname``, ``state``, ``severity``,
``summary``, ``runbook``, ``active_at``, ``job``.

opsctl.console/4 (from /3): per endpoint ``engines`` is a list (it was the number of
engines): each data-parallel engine (vLLM's ``engine`` label; one entry for a
single-engine server, none before the first vLLM answer) judged on its own by the stall
rule: ``engine`` (the label), ``role`` (``EngineCore_DP1``; ``EngineCore`` for one
engine), ``state`` (ready, busy, stalled), ``reason`` (why stalled), ``requests_running``,
``requests_waiting``, ``kv_cache_usage``, ``generation_tokens_per_s``,
``engine_steps_per_s``, ``flat_s`` (seconds its generation, steps and KV cache have been
flat with requests running; 0 when it moved at the last reading, null when idle),
``stalled_for_s`` (``flat_s`` when stalled, else null) and ``canary`` (``--once`` on a
server of several engines: the 1-token completion sent to this engine alone, with
``X-data-parallel-rank``; null when none was sent). The endpoint is stalled when any
engine is, and its reason names the engine. ``kv_cache_usage`` of the endpoint is its
engines' mean (it was their sum), ``kv_capacity_tokens`` and ``kv_used_tokens`` every
engine's."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from opsctl.console import columns
from opsctl.console import judge_advisor as advisor
from opsctl.console import judge_logview as logview
from opsctl.console import judge_requests as rq
from opsctl.console.judge import EndpointView, FleetSnapshot
from opsctl.console.judge_state import state_counts, verdict
from opsctl.domain import gpu as gpu_view

SCHEMA = "console/4"


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def endpoint_dict(v: EndpointView, now: float) -> dict[str, Any]:
    """One endpoint of the console document."""
    f = v.figures
    t = v.target
    ttft = f.latency.get("ttft")
    model = v.info.models[0] if v.info.models else None
    return {
        "name": t.name,
        "url": t.url,
        "source": t.source,
        "labels": dict(t.labels),
        "state": v.state,
        "reason": gpu_view.shown_reason(v),
        "model": model.id if model else None,
        "max_model_len": model.max_model_len if model else None,
        "models": [m.id for m in v.info.models],
        "vllm_version": v.info.version,
        "health_status": v.health_status,
        "requests_running": f.running,
        "requests_waiting": f.waiting,
        "kv_cache_usage": _r(f.kv_usage),
        "kv_capacity_tokens": f.kv_capacity_tokens,
        "kv_used_tokens": f.kv_used_tokens,
        "prefix_cache_hit_rate": _r(f.prefix_hit_rate),
        "prefix_cache_hit_rate_lifetime": _r(f.prefix_hit_rate_lifetime),
        "prompt_tokens_per_s": _r(f.prompt_tps, 2),
        "generation_tokens_per_s": _r(f.generation_tps, 2),
        "requests_per_s": _r(f.request_rate, 3),
        "preemptions_per_s": _r(f.preemption_rate, 3),
        "engine_steps_per_s": _r(f.steps_per_s, 2),
        "tokens_per_engine_step": _r(f.tokens_per_step, 2),
        "preemptions_total": f.preemptions_total,
        "prompt_tokens_total": f.prompt_tokens_total,
        "generation_tokens_total": f.generation_tokens_total,
        "requests_total": f.requests_total,
        "prompt_tokens_by_source": {k: _r(x) for k, x in f.prompt_tokens_by_source.items()},
        "waiting_by_reason": f.waiting_by_reason,
        "finished_by_reason": f.finished_by_reason,
        "ttft_p50_s": _r(ttft.p50 if ttft else None, 6),
        "ttft_p95_s": _r(ttft.p95 if ttft else None, 6),
        "latency_basis": f.latency_basis,
        "latency_s": {k: {n: _r(x, 6) for n, x in asdict(q).items()} for k, q in f.latency.items()},
        "engines": [e.to_dict() for e in v.engines],
        "restarts_seen": v.restarts,
        "scrapes": v.scrapes,
        "data_age_s": _r(v.age(now), 2),
        "poll_s": _r(v.poll_s, 4),
        "pids": [{"pid": p.pid, "role": p.role} for p in (v.local.procs if v.local else ())],
        "pid": t.pid,
        "run_dir": t.run_dir,
        "server_info": v.info.server_info,
        "findings": [a.to_dict() for a in advisor.findings(v)],
        "gpus": [gpu_view.device_dict(d) for d in v.gpus],
        "stall_gpu": (sg.to_dict() if (sg := gpu_view.stall_gpu(v.state, v.gpus)) else None),
        "tee": rq.requests_dict(v.requests),  # console --tee: live requests
        "log": logview.log_dict(v.log),  # console --log / targets 'log': the tailed log
        "alerts": [a.to_dict() for a in v.alerts],  # --prometheus: its firing alerts
    }


def document(
    snap: FleetSnapshot,
    *,
    stall_window_s: float | None = None,
    observed_s: float | None = None,
) -> dict[str, Any]:
    """The console document of a snapshot, with its exit code and reason."""
    from opsctl.output import document as doc

    views = snap.endpoints
    code, reason = verdict(views, snap.source)
    return doc(
        SCHEMA,
        taken_at=round(snap.taken_at, 3),
        source=snap.source,
        interval_s=snap.interval_s,
        stall_window_s=stall_window_s,
        observed_s=_r(observed_s, 2),
        counts=state_counts(views),
        exit_code=code,
        reason=reason,
        hint=snap.hint,
        endpoints=[endpoint_dict(v, snap.taken_at) for v in views],
        host=gpu_view.host_dict(snap.host_gpus),
    )


def render_plain(console, snap: FleetSnapshot) -> None:
    """Print the snapshot's table on stdout (plain full-width when piped).

    Piped, the first line is the header (opsctl.output.PlainConsole; the title only on a
    terminal). The columns are those opsctl.console.columns declares for ``--once`` (the
    GPU column on a GPU host only).
    The hint and the verdict's reason go to stderr (the command prints them)."""
    from rich.table import Table

    t = Table(title=f"{len(snap.endpoints)} endpoints" if console.is_terminal else None)
    shown = columns.once_columns(snap.host_gpus)
    for col in shown:
        t.add_column(col.header)
    row = columns.Row(snap.taken_at, snap.interval_s, surface=columns.ONCE, host=snap.host_gpus)
    for v in snap.endpoints:
        t.add_row(*columns.cells(shown, v, row))
    console.print(t)
