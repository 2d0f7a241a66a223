"""The console's text of findings, GPUs and alerts: row cells and drill-in lines.

The domain (opsctl.console.judge_advisor, opsctl.domain.gpu, opsctl.domain.alert_rules) returns
findings, readings and alerts as data; this module words them for the table's cells, the
drill-in and ``--once``'s text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opsctl.console.judge import EndpointView
from opsctl.console.judge_advisor import findings, ordered
from opsctl.console.judge_endpoint_notes import FiredAlert
from opsctl.domain.gpu import NO_GPU, GpuDevice, HostGpus, shown_reason


def marker(view: EndpointView) -> str:
    """The row's compact cell: the top finding's code, '+N' more; '' for none."""
    found = findings(view)
    if not found:
        return ""
    more = f" +{len(found) - 1}" if len(found) > 1 else ""
    return f"{found[0].code}{more}"


def engines_cell(view: EndpointView) -> str:
    """``1/2 engines stalled: `` for a server of several engines with some stalled; ''."""
    stalled = view.stalled_engines()
    if not stalled:
        return ""
    return f"{len(stalled)}/{len(view.engines)} engines stalled: "


def reason_cell(view: EndpointView, width: int = 80) -> str:
    """The row's reason cell: the state's reason, then the top finding's marker.

    The marker is the top finding from figures (``⚑ code +N``); the state's own finding
    is the reason already. A server of several engines with some stalled starts with how
    many (``1/2 engines stalled: engine 1 (EngineCore_DP1): ...``)."""
    reason = (engines_cell(view) + (shown_reason(view) or ""))[:width]
    found = ordered(getattr(view, "findings", ()))
    if not found:
        return reason
    more = f" +{len(found) - 1}" if len(found) > 1 else ""
    mark = f"⚑ {found[0].code}{more}"
    return f"{reason}  {mark}" if reason else mark


def detail_lines(view: EndpointView) -> list[str]:
    """The drill-in's findings: each with its severity, message, figures and next."""
    found = findings(view)
    if not found:
        return []
    lines = [f"findings ({len(found)}):"]
    for a in found:
        figs = "  ".join(f"{k} {_show(v)}" for k, v in a.figures.items())
        lines += [
            f"  {a.severity.upper()} {a.code}: {a.message}",
            f"    {figs}",
            f"    next: {a.next}",
        ]
    return lines


def engine_lines(view: EndpointView) -> list[str]:
    """The drill-in's engines: one line per data-parallel engine (several only).

    Its role, state, requests running and waiting, KV usage, generation and step rates,
    how long it has been flat with requests running, its canary, and why it is stalled."""
    if len(view.engines) < 2:
        return []
    stalled = len(view.stalled_engines())
    lines = [f"engines ({len(view.engines)}, {stalled} stalled), each judged on its own:"]
    for e in view.engines:
        flat = "-" if e.flat_s is None else f"{e.flat_s:.0f} s"
        line = (
            f"  engine {e.engine} {e.role:<15} {e.state:<8} run {_num(e.running)}  wait "
            f"{_num(e.waiting)}  KV {_num(e.kv_usage, 100, '.1f')} %  gen "
            f"{_num(e.generation_tps, 1, '.1f')} tok/s  steps {_num(e.steps_per_s, 1, '.1f')}/s"
            f"  flat {flat}"
        )
        if e.canary is not None:
            line += f"  canary: {e.canary.detail}"
        lines.append(line)
        if e.reason:
            lines.append(f"    {e.reason}")
    return lines


def _num(v: float | None, scale: float = 1.0, spec: str = ".0f") -> str:
    return "-" if v is None else f"{v * scale:{spec}}"


def _show(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items()) or "-"
    if isinstance(v, list | tuple):
        return ",".join(map(str, v)) or "-"
    return str(v)


# ---- GPUs ---------------------------------------------------------------------------------


def gib(n: int | None, nd: int = 0) -> str:
    """Bytes as GiB with ``nd`` decimals; ``?`` for unknown."""
    return "?" if n is None else f"{n / 2**30:.{nd}f}"


def short(d: GpuDevice) -> str:
    """One GPU in a row cell: ``GPU0 71% 60/141G`` (``?`` for what is unknown)."""
    util = "?" if d.util_pct is None else f"{d.util_pct:.0f}%"
    return f"{d.label} {util} {gib(d.mem_used_bytes)}/{gib(d.mem_total_bytes)}G"


def gpu_row_cell(v: Any, host: HostGpus | None = None) -> str:
    """The row's GPU cell: its GPUs, ``no GPU``, ``none`` or ``-`` (never blank).

    Its GPUs read ``GPU0 71% 60/141G``; a local endpoint on a host without a GPU reads
    ``no GPU``, on a GPU host ``none`` (its processes hold no GPU memory); ``-`` for a
    remote endpoint or when not collected: a blank never reads as zero."""
    if v.gpus:
        return " ".join(short(d) for d in v.gpus)
    if host is None or v.local is None:
        return "-"
    return "none" if host.devices else NO_GPU


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "?" if v is None else f"{v:{spec}}{suffix}"


def gpu_detail_lines(gpus: Iterable[GpuDevice]) -> list[str]:
    """The drill-in's GPU block: per GPU its readings, per process role and memory.

    Per GPU: util, memory used/total, temperature (slowdown at), power/limit, fan,
    SM/memory clocks; per process its role, pid and memory."""
    out = []
    for d in gpus:
        out.append(
            f"{d.label} {d.name}  util {_fmt(d.util_pct, '.0f', ' %')}  mem "
            f"{gib(d.mem_used_bytes, 1)}/{gib(d.mem_total_bytes, 1)} GiB  temp "
            f"{_fmt(d.temp_c, '.0f', ' C')} (slowdown {_fmt(d.temp_slowdown_c, '.0f', ' C')})  "
            f"power {_fmt(d.power_w, '.0f')}/{_fmt(d.power_limit_w, '.0f', ' W')}  fan "
            f"{_fmt(d.fan_pct, '.0f', ' %')}  clocks SM {_fmt(d.sm_clock_mhz, '.0f')} / mem "
            f"{_fmt(d.mem_clock_mhz, '.0f', ' MHz')}"
        )
        for p in d.processes:
            out.append(f"    {p.role or '?'} pid {p.pid}  {gib(p.used_bytes, 2)} GiB")
    return out


def alerts_cell(alerts: tuple[FiredAlert, ...]) -> str:
    """The row's prefix: ``ALERT VllmEngineStalled: `` (``+N`` when there are more)."""
    if not alerts:
        return ""
    more = f" +{len(alerts) - 1}" if len(alerts) > 1 else ""
    return f"ALERT {alerts[0].name}{more}: "
