"""The ONE definition of opsctl's fleet alerts (pure), and the Prometheus rules file.

Windows, thresholds, alert names, severities, summaries and runbook commands, and the rules file
built from them.

The console reads its own stall window and restart hold from here too
(opsctl.console.judge_state.Settings defaults), so the console and the alerts cannot drift.

The stall alert is the console's rule (EndpointTracker, prom_view.PromEndpoint: one
``Progress`` per data-parallel engine) in PromQL, per ``job, instance, engine``: each
engine of a server is judged on its own (a series without an ``engine`` label is engine
"0"), so one engine that stalls while another serves fires, naming its engine. The
console calls an engine stalled at a scrape ``t`` when every scrape in
``(t - W, t]`` had requests running and a generation-token total, an engine-step count
(``vllm:iteration_tokens_total_count``) and a KV cache usage equal to the scrape before
it: a slowed engine advances its steps, and a long prefill (for which vLLM publishes no
step or token until it ends) fills the KV cache chunk by chunk: slow, not stalled. In
PromQL, evaluated at ``t``:

* ``min_over_time(running[W-1ms]) > 0``: every scrape in the window ran requests. The
  range is one millisecond short of W so that Prometheus 2 (ranges closed on the left)
  and 3 (open on the left) both select ``(t - W, t]``;
* ``changes(gen[W-1ms]) == 0`` and ``gen - gen offset W == 0``: no scrape in the window
  moved, not even the first against the one before the window (``offset W`` is the
  last scrape at or before ``t - W``; absent before there is one, as the console needs
  a first scrape to call anything flat); the same two for the step count and the KV
  cache's usage;
* ``up == 1``: the scrape itself answered (a dead server is VllmTargetDown).

The rule needs two scrapes inside the window: scrape vLLM at most every W/2 (5 s for the
default 10 s window). tests/unit/test_promtool_rules.py evaluates both rules on the same
series and shows they agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from opsctl.console.judge_endpoint_notes import FiredAlert

# the counters whose going back is a restart, and the start time: the console's own
from opsctl.console.judge_prom import RESET_COUNTERS, START_TIME
from opsctl.domain.metrics import GEN_TOKENS, KV_USAGE, REQUEST_SUCCESS, RUNNING, STEPS, WAITING

# ---- windows and thresholds (the console reads the first two) -------------------------------
STALL_WINDOW_S = 10.0  # generation, steps and KV flat this long, requests running = stalled
RESTART_HOLD_S = 10.0  # a counter that went back within this long = restarted
RATE_WINDOW_S = 60.0  # rates, ratios and quantiles of the alerts
RESTART_LOOP_WINDOW_S = 900.0  # restarts counted over 15 minutes ...
RESTART_LOOP_COUNT = 3  # ... this many is a loop
# the console advisor's findings (opsctl.console.judge_advisor) read these two, so a finding on
# a console row and its alert mean the same (kv_preemption = VllmKvCacheSaturated,
# request_errors = VllmRequestErrors), over RATE_WINDOW_S = the console's latency window
KV_PREEMPTION_MIN_PER_S = 0.05  # preemptions/s: the KV cache is full (vllmstat's threshold)
QUEUE_GROWTH_WINDOW_S = 120.0  # requests waiting the whole window and the queue growing
ERROR_RATIO = 0.02  # finished with finished_reason="error", of finished (vllmstat's)
TTFT_P99_S = 5.0  # time to first token, 99th percentile over the rate window
DEFAULT_FOR_S = 60.0  # `opsctl rules --for`: how long a condition holds before it fires
TARGET_SEEN_S = 3600.0  # without --job: targets that exported vLLM series this recently

PREEMPTIONS = "vllm:num_preemptions_total"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
# vLLM's KV cache gauge; vLLM before 0.10 called it gpu_cache_usage_perc
KV_USAGE_NAMES = (KV_USAGE, "vllm:gpu_cache_usage_perc")

# ---- the canary: the blackbox exporter probing a one-token completion -----------------------
# An engine stopped (or hung) while idle keeps /health 200 and its gauges at 0: no series
# moves, so no rule over vLLM's own metrics can see it. The blackbox exporter (Debian's
# prometheus-blackbox-exporter) POSTs this body to /v1/completions of every target (vLLM
# takes a request without "model": its first served model answers), as console --once
# and status send their canary (opsctl.collectors.canary).
CANARY_BODY = {"prompt": "ok", "max_tokens": 1, "temperature": 0}
CANARY_JOB = "vllm-canary"  # the scrape job of the exporter's probes (the alert's selector)
CANARY_MODULE = "vllm_canary"  # the module in blackbox.yml
CANARY_TIMEOUT_S = 10.0  # the module's deadline: the console's --canary-timeout default
CANARY_SLOW_S = 5.0  # a probe that succeeds but takes this long fires too
CANARY_INTERVAL_S = 15.0  # how often the scrape job probes each server
EXPORTER = "127.0.0.1:9115"  # the blackbox exporter's default address

GROUP = "opsctl-vllm"
RECORDING_GROUP = "opsctl-vllm-recording"
BY = "job, instance"
ENGINE = "engine"  # vLLM's label of a data-parallel engine
BY_ENGINE = f"{BY}, {ENGINE}"


@dataclass(frozen=True, slots=True)
class Alert:
    """One fleet alert: name, severity, summary, runbook command, PromQL and its ``for``."""

    name: str
    severity: str  # critical | warning | info
    summary: str
    runbook: str  # the opsctl command to run next
    expr: str
    for_s: float | None  # None: `--for` (conditions); 0: events, fire at once


def dur(seconds: float) -> str:
    """A Prometheus duration to the millisecond, as a reader writes it.

    For example ``10s``, ``15m``, ``250ms`` or ``9s999ms`` (a compound duration, Prometheus 2.x
    and 3.x).
    """
    ms = max(1, round(seconds * 1000))
    if ms % 1000 == 0:
        s = ms // 1000
        return f"{s // 60}m" if s % 60 == 0 and s >= 60 else f"{s}s"
    s, rest = divmod(ms, 1000)
    return f"{s}s{rest}ms" if s else f"{rest}ms"


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(job: str | None, extra: str = "") -> str:
    """The PromQL label selector for ``job`` plus ``extra`` matchers ("" when neither)."""
    parts = [f"job={quote(job)}"] if job else []
    if extra:
        parts.append(extra)
    return "{" + ", ".join(parts) + "}" if parts else ""


def engine_sum(expr: str) -> str:
    """``expr`` summed per endpoint and data-parallel engine (no ``engine`` label: "0").

    vLLM labels each data-parallel engine's series ``engine="N"``; a series without the
    label is engine "0", as the console reads it (opsctl.domain.metrics.PER_ENGINE)."""
    labelled = f'label_replace({expr}, "{ENGINE}", "0", "{ENGINE}", "")'
    return f"sum by ({BY_ENGINE}) ({labelled})"


def stall_expr(job: str | None, window_s: float = STALL_WINDOW_S) -> str:
    """The console's stall rule (module docstring), per job, instance and engine.

    Each data-parallel engine on its own (the console's EngineProgress): one engine's
    progress never hides another's stall; the alert carries the ``engine`` label."""
    sel = selector(job)
    inside = dur(window_s - 0.001)
    w = dur(window_s)
    on = f"and on ({BY_ENGINE})"
    lines = [f"({engine_sum(f'min_over_time({RUNNING}{sel}[{inside}])')} > 0)"]
    for m in (GEN_TOKENS, STEPS, KV_USAGE):
        lines.append(f"{on} ({engine_sum(f'changes({m}{sel}[{inside}])')} == 0)")
        lines.append(f"{on} ({engine_sum(f'{m}{sel} - {m}{sel} offset {w}')} == 0)")
    lines.append(f"and on ({BY}) (up{sel} == 1)")
    return "\n".join(lines)


def restarts_expr(job: str | None, window_s: float) -> str:
    """Restarts per vLLM endpoint over ``window_s``: the most any restart signal saw.

    The signals are the console's: counters that went back, process start-time changes. One
    restart moves them all, so the most, not the sum (opsctl.console.judge_prom.figures_parts).
    """
    sel, w = selector(job), dur(window_s)
    terms = [(m, f"resets({m}{sel}[{w}])") for m in RESET_COUNTERS]
    terms.append((START_TIME, f"changes({START_TIME}{sel}[{w}])"))
    tagged = [f'label_replace({e}, "signal", "{m}", "", "")' for m, e in terms]
    seen = f"group by ({BY}) ({RUNNING}{sel})"
    return f"max by ({BY}) (\n  " + "\n  or ".join(tagged) + f"\n) and on ({BY}) {seen}"


def kv_expr(job: str | None) -> str:
    """PromQL: requests preempted for KV cache space at the advisor's kv_preemption rate.

    vLLM preempts only when the KV cache is full: the rate is the saturation.
    """
    rate = f"sum by ({BY}) (rate({PREEMPTIONS}{selector(job)}[{dur(RATE_WINDOW_S)}]))"
    return f"{rate} >= {KV_PREEMPTION_MIN_PER_S:g}"


def queue_expr(job: str | None) -> str:
    """PromQL: a waiting queue never empty and still growing over the growth window."""
    sel, w = selector(job), dur(QUEUE_GROWTH_WINDOW_S)
    return (
        f"(sum by ({BY}) (min_over_time({WAITING}{sel}[{w}])) > 0)\n"
        f"and on ({BY}) (sum by ({BY}) (deriv({WAITING}{sel}[{w}])) > 0)"
    )


def errors_expr(job: str | None) -> str:
    """PromQL: the share of requests finished with an error at or above ERROR_RATIO."""
    w = dur(RATE_WINDOW_S)
    errored = selector(job, 'finished_reason="error"')
    bad = f"sum by ({BY}) (rate({REQUEST_SUCCESS}{errored}[{w}]))"
    every = f"sum by ({BY}) (rate({REQUEST_SUCCESS}{selector(job)}[{w}]))"
    return f"({bad} / ({every} > 0)) >= {ERROR_RATIO:g}"


def ttft_expr(job: str | None) -> str:
    """PromQL: the p99 time to first token above TTFT_P99_S."""
    rate = f"sum by ({BY}, le) (rate({TTFT_BUCKET}{selector(job)}[{dur(RATE_WINDOW_S)}]))"
    return f"histogram_quantile(0.99, {rate}) > {TTFT_P99_S:g}"


def down_expr(job: str | None) -> str:
    """PromQL: a vLLM target Prometheus scraped lately that is down."""
    if job:
        return f"up{selector(job)} == 0"
    seen = f"group by ({BY}) (last_over_time({RUNNING}[{dur(TARGET_SEEN_S)}]))"
    return f"(up == 0) and on ({BY}) {seen}"


def canary_expr() -> str:
    """PromQL: the blackbox canary failed (no answer in time, or an error) or was slow.

    ``probe_success`` 0 (the exporter's verdict on the 1-token completion) or a probe that
    took CANARY_SLOW_S or more; per target of the CANARY_JOB scrape job, whose ``instance``
    is the vLLM server's host:port (canary_scrape_job), as in the vLLM job."""
    sel = selector(CANARY_JOB)
    return f"(probe_success{sel} == 0)\nor (probe_duration_seconds{sel} >= {CANARY_SLOW_S:g})"


CONSOLE = "opsctl console http://{{ $labels.instance }}"


def alerts(job: str | None) -> list[Alert]:
    """The fleet alerts for ``job`` (None: every job), in the rules file's order."""
    w = f"{STALL_WINDOW_S:g} s"
    loop = f"{RESTART_LOOP_COUNT} restarts in {RESTART_LOOP_WINDOW_S / 60:g} min"
    return [
        Alert("VllmEngineStalled", "critical",
              f"{{{{ $labels.instance }}}} engine {{{{ $labels.engine }}}}: requests running, "
              f"no token generated, no engine step and no KV cache change for {w}, /metrics "
              "still answering",
              f"{CONSOLE} (drill in: stalled, steps flat?); on its host opsctl stacks "
              "http://INSTANCE (where each process waits), then opsctl runs bundle RUN",
              stall_expr(job), None),
        Alert("VllmEngineRestarted", "warning",
              "{{ $labels.instance }}: vLLM's counters went back: the server restarted",
              f"{CONSOLE}; opsctl runs list (the engine's run, its log)",
              f"({restarts_expr(job, RESTART_HOLD_S)}) > 0", 0.0),
        Alert("VllmRestartLoop", "critical",
              f"{{{{ $labels.instance }}}}: {loop}",
              "opsctl runs bundle RUN (the engine's log and records), then "
              "opsctl serve --model MODEL to reproduce",
              f"({restarts_expr(job, RESTART_LOOP_WINDOW_S)}) >= {RESTART_LOOP_COUNT}", 0.0),
        Alert("VllmKvCacheSaturated", "warning",
              f"{{{{ $labels.instance }}}}: KV cache full: requests preempted "
              f"({KV_PREEMPTION_MIN_PER_S:g}/s or more over {RATE_WINDOW_S:g} s)",
              f"{CONSOLE} (KV use, preemptions); opsctl diag kv-fail --model MODEL",
              kv_expr(job), None),
        Alert("VllmQueueBacklog", "warning",
              f"{{{{ $labels.instance }}}}: requests waiting for {QUEUE_GROWTH_WINDOW_S:g} s "
              "and the queue growing",
              f"{CONSOLE} (waiting by reason)",
              queue_expr(job), None),
        Alert("VllmRequestErrors", "warning",
              f"{{{{ $labels.instance }}}}: {ERROR_RATIO:.0%} or more of requests finished "
              "with an error",
              f"{CONSOLE}; opsctl certify http://{{{{ $labels.instance }}}}",
              errors_expr(job), None),
        Alert("VllmTtftP99High", "warning",
              f"{{{{ $labels.instance }}}}: time to first token p99 over {TTFT_P99_S:g} s",
              f"{CONSOLE} (TTFT, waiting, KV use)",
              ttft_expr(job), None),
        Alert("VllmCanaryFailed", "critical",
              "{{ $labels.instance }}: a 1-token completion (the blackbox canary) failed or "
              f"took {CANARY_SLOW_S:g} s or more, whatever /health and the gauges say (an "
              "engine stopped or hung while idle shows no other sign)",
              "opsctl console --once http://{{ $labels.instance }} (its own canary, the "
              "processes' state); on its host opsctl stacks http://INSTANCE (a stopped or hung EngineCore)",
              canary_expr(), None),
        Alert("VllmTargetDown", "critical",
              "{{ $labels.instance }}: Prometheus cannot scrape this vLLM server",
              "opsctl status http://{{ $labels.instance }}",
              down_expr(job), None),
    ]  # fmt: skip


def recording_rules(job: str | None) -> list[dict]:
    """The recording rules the alerts and dashboards read, for ``job``."""
    sel, w = selector(job), dur(RATE_WINDOW_S)
    return [
        {"record": "instance:vllm_requests_running:sum",
         "expr": f"sum by ({BY}) ({RUNNING}{sel})"},
        {"record": "instance:vllm_requests_waiting:sum",
         "expr": f"sum by ({BY}) ({WAITING}{sel})"},
        {"record": "instance:vllm_generation_tokens:rate1m",
         "expr": f"sum by ({BY}) (rate({GEN_TOKENS}{sel}[{w}]))"},
        {"record": "instance:vllm_ttft_seconds:p99_rate1m",
         "expr": f"histogram_quantile(0.99, sum by ({BY}, le) (rate({TTFT_BUCKET}{sel}[{w}])))"},
    ]  # fmt: skip


def rules_document(job: str | None = None, for_s: float = DEFAULT_FOR_S) -> dict:
    """The rules file as a plain document (YAML-dumped by the command)."""
    rules = []
    for a in alerts(job):
        rule: dict = {"alert": a.name, "expr": a.expr}
        hold = for_s if a.for_s is None else a.for_s
        if hold > 0:
            rule["for"] = dur(hold)
        rule["labels"] = {"severity": a.severity, "source": "opsctl"}
        rule["annotations"] = {"summary": a.summary, "runbook": a.runbook}
        rules.append(rule)
    return {
        "groups": [
            {"name": RECORDING_GROUP, "rules": recording_rules(job)},
            {"name": GROUP, "rules": rules},
        ]
    }


ALERT_NAMES = tuple(a.name for a in alerts(None))


def rules_yaml(job: str | None = None, for_s: float = DEFAULT_FOR_S) -> str:
    """The rules file's text: a header naming its settings, then the YAML.

    Multi-line expressions are literal blocks, so the PromQL reads as written.
    """
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    head = (
        "# Prometheus rules for vLLM, written by `opsctl rules`"
        f"{f' --job {job}' if job else ''} --for {dur(for_s)}.\n"
        f"# Stall window {STALL_WINDOW_S:g} s: scrape vLLM every {STALL_WINDOW_S / 2:g} s "
        "or faster.\n"
    )
    body = yaml.dump(rules_document(job, for_s), Dumper=Dumper, sort_keys=False, width=1000)
    return head + body


def blackbox_module(key_file: str | None = None) -> dict:
    """blackbox.yml: the CANARY_MODULE module, a POST of CANARY_BODY to /v1/completions.

    Success is HTTP 200 with a choice that finished, within CANARY_TIMEOUT_S (the exporter
    also cuts it at the scrape timeout less half a second); ``key_file`` holds the API key
    of servers started with ``--api-key``, sent as the bearer token."""
    http: dict = {
        "method": "POST",
        "headers": {"Content-Type": "application/json"},
        "body": json.dumps(CANARY_BODY),
        "valid_status_codes": [200],
        "fail_if_body_not_matches_regexp": ['"finish_reason"'],
        "preferred_ip_protocol": "ip4",
    }
    if key_file:
        http["bearer_token_file"] = key_file
    module = {"prober": "http", "timeout": dur(CANARY_TIMEOUT_S), "http": http}
    return {"modules": {CANARY_MODULE: module}}


def canary_scrape_job(
    targets: list[str], exporter: str = EXPORTER, interval_s: float = CANARY_INTERVAL_S
) -> dict:
    """The Prometheus scrape job that has the exporter probe each vLLM ``targets`` (host:port).

    The probe's target is the server's /v1/completions; its ``instance`` label stays the
    server's host:port, as in the vLLM job, so the alert and the console's row agree. The
    scrape timeout leaves the module its deadline (the exporter keeps half a second)."""
    timeout = min(interval_s, CANARY_TIMEOUT_S + 1.0)
    return {
        "job_name": CANARY_JOB,
        "metrics_path": "/probe",
        "params": {"module": [CANARY_MODULE]},
        "scrape_interval": dur(interval_s),
        "scrape_timeout": dur(timeout),
        "static_configs": [{"targets": list(targets)}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "target_label": "__param_target",
             "replacement": "http://${1}/v1/completions"},
            {"source_labels": ["__address__"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": exporter},
        ],
    }  # fmt: skip


def blackbox_yaml(key_file: str | None = None) -> str:
    """blackbox.yml's text: a header showing the scrape job that uses it, then the module."""
    import yaml

    job = yaml.safe_dump({"scrape_configs": [canary_scrape_job(["127.0.0.1:8000"])]},
                         sort_keys=False, width=1000)  # fmt: skip
    head = (
        "# The blackbox exporter's module for opsctl's vLLM canary, written by `opsctl rules "
        "--blackbox-out`.\n"
        f"# A 1-token completion per probe; the alert VllmCanaryFailed reads job {CANARY_JOB}.\n"
        "# Scrape it from prometheus.yml (targets: the vLLM servers' host:port; the last\n"
        f"# replacement: where the exporter listens):\n"
        + "".join(f"#   {line}\n" for line in job.splitlines())
    )
    return head + yaml.safe_dump(blackbox_module(key_file), sort_keys=False, width=1000)


# ---- alerts Prometheus holds (GET /api/v1/alerts), as the console shows them -------------------


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def parse_alerts(data: object) -> list[FiredAlert]:
    """The ``data`` of /api/v1/alerts as FiredAlerts.

    ``data`` is ``{"alerts": [...]}``; entries that are not alerts are skipped.
    """
    items = data.get("alerts") if isinstance(data, dict) else None
    out = []
    for a in items if isinstance(items, list) else []:
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            continue
        labels, notes = a["labels"], a.get("annotations") or {}
        if "alertname" not in labels:
            continue
        out.append(
            FiredAlert(
                name=str(labels["alertname"]),
                state=str(a.get("state") or "firing"),
                severity=labels.get("severity"),
                summary=notes.get("summary") or notes.get("description"),
                runbook=notes.get("runbook") or notes.get("runbook_url"),
                active_at=a.get("activeAt"),
                instance=labels.get("instance"),
                job=labels.get("job"),
            )
        )
    return out


def firing_for(alerts: list[FiredAlert], instance: str) -> tuple[FiredAlert, ...]:
    """The firing alerts of the endpoint Prometheus labels ``instance``, most severe first.

    Any job counts: a rule on the /health job names the same server.
    """
    mine = [a for a in alerts if a.state == "firing" and a.instance == instance]
    return tuple(sorted(mine, key=lambda a: (SEVERITY_ORDER.get(a.severity or "", 3), a.name)))
