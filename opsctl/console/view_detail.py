"""Drill-in panels of one endpoint: its state, figures, latency, sparklines and local details.

The sparklines cover the last 10 minutes; a local endpoint's details (process tree,
Engram tables, patch ledger, log tail) are serve's panels, reused.
"""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from opsctl.console.columns import age_text, fmt
from opsctl.console.judge import EndpointView
from opsctl.console.local import LocalDetail
from opsctl.console.render_advice import detail_lines as advisor_detail_lines
from opsctl.console.render_advice import engine_lines, gpu_detail_lines
from opsctl.console.view_drill_in import alert_lines, log_lines, requests_lines
from opsctl.console.view_panel import STATE_STYLE
from opsctl.domain.gpu import shown_reason
from opsctl.output import human_bytes

LATENCY_ROWS = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT"),
    ("itl", "inter-token"),
    ("e2e", "end-to-end"),
    ("queue", "queue"),
    ("prefill", "prefill"),
    ("decode", "decode"),
)
SPARKS = (
    ("generation_tps", "gen tok/s"),
    ("prompt_tps", "prompt tok/s"),
    ("running", "running"),
    ("waiting", "waiting"),
    ("kv_usage", "KV usage"),
)


def _pct_map(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 100:.0f} %" for k, v in d.items()) or "-"


def summary_text(v: EndpointView, now: float, interval: float) -> Text:
    """The drill-in's head: state, name and URL, age, reason, engine line, labels, local run.

    Then Prometheus's firing alerts, the advisor's findings and the --tee / --log lines.
    """
    t = Text()
    t.append(f" {v.state.upper()} ", style=f"reverse {STATE_STYLE.get(v.state, '')}")
    t.append(f"  {v.target.name}  {v.target.url}  ({v.target.source})")
    age = age_text(v, now, interval)
    if age:
        t.append(f"  {age}", style="yellow")
    reason = shown_reason(v)
    if reason:
        t.append(f"\n{reason}", style="bold")
    model = v.info.models[0] if v.info.models else None
    t.append(
        f"\nvLLM {v.info.version or '-'}   model {model.id if model else '-'}   max model len "
        f"{model.max_model_len if model and model.max_model_len else '-'}   engines "
        f"{v.figures.engines or '-'}   /health {v.health_status or '-'}   restarts "
        f"{v.restarts}   polls {v.scrapes}   poll {fmt(v.poll_s, '.0f', 1000, ' ms')}"
    )
    if v.target.labels:
        t.append("\nlabels " + " ".join(f"{k}={x}" for k, x in v.target.labels))
    if v.target.pid:
        t.append(
            f"\nlocal pid {v.target.pid}"
            + (f"   run {v.target.run_dir}" if v.target.run_dir else "")
        )
    for line in engine_lines(v):  # each data-parallel engine on its own
        t.append(f"\n{line}", style="bold magenta" if "stalled" in line[:40] else "")
    for line in alert_lines(v.alerts):  # Prometheus's firing alerts, runbooks
        t.append(f"\n{line}", style="bold red" if line.startswith("alerts") else "")
    for line in advisor_detail_lines(v):  # findings: figures, window, next command
        t.append(f"\n{line}", style="yellow" if line.startswith("findings") else "")
    for line in requests_lines(v.requests) + log_lines(v.log):  # --tee, --log
        t.append(f"\n{line}", style="bold" if line.startswith(("requests (", "log ")) else "")
    return t


def figures_text(v: EndpointView) -> str:
    """The endpoint's figures: requests, KV and prefix cache, token rates, steps, totals, GPUs."""
    f = v.figures
    return (
        f"requests running {fmt(f.running, '.0f')}  waiting {fmt(f.waiting, '.0f')} "
        f"(by reason: {', '.join(f'{k} {x:.0f}' for k, x in f.waiting_by_reason.items()) or '-'})\n"
        f"KV cache {fmt(f.kv_usage, '.1f', 100, ' %')}  used {fmt(f.kv_used_tokens, '.0f')} of "
        f"{fmt(f.kv_capacity_tokens, '.0f')} tokens   prefix cache hit "
        f"{fmt(f.prefix_hit_rate, '.1f', 100, ' %')} (lifetime "
        f"{fmt(f.prefix_hit_rate_lifetime, '.1f', 100, ' %')})\n"
        f"tokens/s prompt {fmt(f.prompt_tps)}  generation {fmt(f.generation_tps)}   "
        f"requests/s {fmt(f.request_rate, '.2f')}   preemptions/s "
        f"{fmt(f.preemption_rate, '.2f')} (total {fmt(f.preemptions_total, '.0f')})\n"
        f"engine steps/s {fmt(f.steps_per_s)}   tokens per step {fmt(f.tokens_per_step, '.2f')}   "
        f"prompt tokens by source: {_pct_map(f.prompt_tokens_by_source)}\n"
        f"totals: prompt {fmt(f.prompt_tokens_total, '.0f')}  generation "
        f"{fmt(f.generation_tokens_total, '.0f')}  requests {fmt(f.requests_total, '.0f')}"
    ) + "".join(f"\n{line}" for line in gpu_detail_lines(v.gpus))  # per GPU and process


class LatencyTable(DataTable):
    """Latency percentiles (p50 to p99, mean, count) per phase; redrawn only when they change."""

    DEFAULT_CSS = "LatencyTable { height: auto; width: auto; }"

    def __init__(self, **kw) -> None:
        super().__init__(cursor_type="none", **kw)
        self.last: tuple | None = None

    def on_mount(self) -> None:
        """The latency columns."""
        self.add_columns("latency", "p50", "p90", "p95", "p99", "mean", "count")

    def show(self, v: EndpointView) -> None:
        """Show ``v``'s latency rows, titled with what they are computed over."""
        lat = v.figures.latency
        rows = []
        for key, label in LATENCY_ROWS:
            q = lat.get(key)
            ms = (lambda x: fmt(x, ".1f", 1000, " ms")) if q else (lambda x: "-")
            rows.append(
                (label, ms(q and q.p50), ms(q and q.p90), ms(q and q.p95), ms(q and q.p99),
                 ms(q and q.mean), fmt(q.count if q else None, ".0f"))
            )  # fmt: skip
        if rows == self.last:
            return
        self.last = rows
        self.clear()
        for r in rows:
            self.add_row(*r)
        self.border_title = f"latency ({v.figures.latency_basis})"


class SparkPanel(Vertical):
    """Sparklines over the last 10 minutes (SPARKS), each under a label with now and max."""

    DEFAULT_CSS = """
    SparkPanel { height: auto; border: round $accent; padding: 0 1; }
    SparkPanel Sparkline { height: 2; }
    SparkPanel Static { height: 1; }
    """

    def compose(self) -> ComposeResult:
        """A label and a sparkline per series in SPARKS."""
        for key, _label in SPARKS:
            yield Static(id=f"lbl-{key}")
            yield Sparkline([], id=f"spark-{key}")

    def on_mount(self) -> None:
        """Title the panel."""
        self.border_title = "last 10 minutes"

    def show(self, series: dict[str, list[float]]) -> None:
        """Show ``series`` (key -> values); a sparkline whose data is unchanged is left alone."""
        for key, label in SPARKS:
            data = series.get(key) or []
            spark = self.query_one(f"#spark-{key}", Sparkline)
            if list(spark.data or []) != data:
                spark.data = data
                top = max(data) if data else None
                scale = 100 if key == "kv_usage" else 1
                self.query_one(f"#lbl-{key}", Static).update(
                    f"{label}: now {fmt(data[-1] if data else None, '.1f', scale)}  "
                    f"max {fmt(top, '.1f', scale)}"
                )


class EngramPanel(Vertical):
    """The Engram tables the endpoint's processes map: size, linked, pids, RSS and PSS."""

    DEFAULT_CSS = "EngramPanel { height: auto; max-height: 8; border: round $accent; }"

    def compose(self) -> ComposeResult:
        """The Engram table."""
        yield DataTable(id="engram-table", cursor_type="none")

    def on_mount(self) -> None:
        """Title the panel and add its columns."""
        self.border_title = "Engram tables mapped"
        self.query_one(DataTable).add_columns("table", "size", "linked", "pids", "RSS", "PSS")

    def update_snapshot(self, d: LocalDetail) -> None:
        """Show the Engram tables of local detail ``d`` ("(none)" when there are none)."""
        t = self.query_one(DataTable)
        t.clear()
        for r in d.engram:
            t.add_row(
                r.name, human_bytes(r.size), "yes" if r.linked else "deleted",
                ",".join(map(str, r.mapper_pids)), human_bytes(r.rss), human_bytes(r.pss),
            )  # fmt: skip
        if not d.engram:
            t.add_row("(none)", "-", "-", "-", "-", "-")


def server_info_text(v: EndpointView) -> str:
    """The endpoint's /server_info as one JSON line (at most 600 chars), or why it is missing."""
    si = v.info.server_info
    if si is None:
        return "/server_info: not exposed (VLLM_SERVER_DEV_MODE=1 only)"
    return "/server_info: " + json.dumps(si, default=str)[:600]
