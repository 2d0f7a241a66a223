"""The console's drill-in text of alerts, tee requests and logs.

The domain holds the facts (:mod:`opsctl.domain.alert_rules`, :mod:`opsctl.console.judge_requests`,
:mod:`opsctl.console.judge_logview`); this writes them for the drill-in panel.
"""

from __future__ import annotations

from opsctl.console import judge_requests as rq
from opsctl.console.judge_endpoint_notes import FiredAlert
from opsctl.console.judge_logview import LogFacts


def alert_lines(alerts: tuple[FiredAlert, ...]) -> list[str]:
    """The drill-in's lines: one per firing alert, then its summary and runbook."""
    if not alerts:
        return []
    lines = [f"alerts firing ({len(alerts)}, from Prometheus)"]
    for a in alerts:
        lines.append(f"  {a.name} [{a.severity or '-'}] since {a.active_at or '-'}")
        if a.summary:
            lines.append(f"    {a.summary}")
        if a.runbook:
            lines.append(f"    next: {a.runbook}")
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def _num(v: int | None) -> str:
    return "-" if v is None else str(v)


def record_line(r: rq.RequestRecord) -> str:
    """One request as a human line: status, endpoint, model, tokens, TTFT and duration."""
    status = "…" if r.in_flight else str(r.status)
    model = r.model or "-"
    if r.adapter:
        model = f"{model} (adapter)"
    how = {rq.FROM_CHUNKS: " (chunks counted)", rq.FROM_USAGE: ""}.get(r.tokens_from or "", "")
    line = (
        f"{status:>12}  {r.method} {r.endpoint}  {model}  {'stream' if r.stream else 'json'}  "
        f"in {_num(r.prompt_tokens)} out {_num(r.output_tokens)}{how}  TTFT {_ms(r.ttft_s)}  "
        f"{'running' if r.in_flight else 'took'} {_ms(r.duration_s)}"
    )
    if r.error:
        line += f"  ({r.error})"
    if r.prompt is not None:
        line += f"\n{'':>14}prompt: {r.prompt[:200]!r}"
    return line


def requests_lines(v: rq.RequestsView | None, limit: int = 12) -> list[str]:
    """The drill-in's requests section (plain text lines)."""
    if v is None:
        return []
    head = (
        f"requests (tee {v.listen_url} -> {v.upstream_url}): {len(v.in_flight)} in flight, "
        f"{v.seen} seen, {v.errors} failed, {v.disconnected} disconnected"
        + ("; prompts kept" if v.keep_prompts else "")
    )
    rows = [record_line(r) for r in [*v.in_flight, *v.recent][:limit]]
    return [head, *(rows or ["  (no request through the tee yet)"])]


def log_lines(f: LogFacts | None) -> list[str]:
    """The drill-in's log section: where it reads, the decisive lines, the tail."""
    if f is None:
        return []
    if f.reason:
        return [f"log {f.path}: {f.reason}"]
    head = f"log {f.path}"
    if f.load_phase:
        head += f"   phase: {f.load_phase}"
    if f.rotations:
        head += f"   rotated/truncated {f.rotations}x"
    out = [head]
    if f.decisive_lines:
        out.append("decisive lines:")
        out += [f"  {line}" for line in f.decisive_lines]
    else:
        out.append("decisive lines: none (no error line in its end)")
    out.append("tail:")
    out += [f"  {line}" for line in f.tail] or ["  (empty)"]
    return out
