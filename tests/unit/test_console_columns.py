"""The console's fleet table, byte for byte: the TUI's cells and ``--once``'s table.

A fixed fleet (every column with something to show: tee requests, findings, alerts, a
reason longer than either surface's cut, a data-parallel server with a stalled engine,
a stale row, one that never answered, a GPU host and one without) is rendered by both
surfaces: ``row_cells`` (the TUI's cells, with check notes) and ``render_plain`` (the
``--once`` table) into a pipe's PlainConsole and into a colour terminal. The bytes must
equal tests/data/console/fleet_table.golden, written from the code before the console's
columns were declared once (opsctl.console.columns). Rewrite it, after a change meant
to alter the output, with ``python -m tests.unit.test_console_columns --write``.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from rich.console import Console

from opsctl.console import judge_requests as rq
from opsctl.console.judge import (
    BUSY,
    DEAD,
    READY,
    STALLED,
    UNREACHABLE,
    EndpointView,
    EngineInfo,
    EngineView,
    Figures,
    FleetSnapshot,
    LocalState,
    ModelInfo,
    ProcRole,
    Quantiles,
    Target,
)
from opsctl.console.judge_endpoint_notes import Advice, FiredAlert
from opsctl.domain.gpu import GpuDevice, GpuProcess, HostGpus

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "console" / "fleet_table.golden"
NOW, INTERVAL = 1000.0, 1.0
GIB = 2**30


def _request(**kw) -> rq.RequestRecord:
    base = dict(
        id=1, method="POST", endpoint="/v1/completions", kind="completions", model="m",
        adapter=None, stream=True, started_at=990.0, status=None, ttft_s=0.05,
        duration_s=0.5, prompt_tokens=None, output_tokens=4, tokens_from=rq.FROM_CHUNKS,
        in_flight=True,
    )  # fmt: skip
    base.update(kw)
    return rq.RequestRecord(**base)


def _gpu(index: int, util: float | None, used: int | None, pid: int) -> GpuDevice:
    return GpuDevice(
        index, "NVIDIA H200", f"GPU-{index}", "nvidia", util, used, 141 * GIB, 45.0, 90.0,
        300.0, 700.0, None, 1980.0, 2619.0, (GpuProcess(pid, used, "EngineCore"),),
    )  # fmt: skip


MODEL = EngineInfo("0.32.0", (ModelInfo("Qwen/Qwen3-0.6B", 4096),), None, 900.0)


def fleet() -> tuple[EndpointView, ...]:
    """Six endpoints that between them fill every column of both tables."""
    busy_figures = Figures(
        running=12.0, waiting=3.0, kv_usage=0.4567, prefix_hit_rate=0.815, prompt_tps=1234.56,
        generation_tps=987.65, latency={"ttft": Quantiles(p50=0.0421, p95=0.3379)},
    )  # fmt: skip
    tee = rq.RequestsView("http://127.0.0.1:8100", "http://127.0.0.1:8000", False,
                          (_request(), _request(id=2)), (), 9, 1, 0)  # fmt: skip
    busy = EndpointView(
        Target("gpu-node", "http://127.0.0.1:8000", "opsctl-run", (("team", "infra"),), pid=10),
        BUSY, None, busy_figures, MODEL, LocalState(True, procs=(ProcRole(10, "APIServer"),)),
        200, 999.5, 999.5, 40, 1, 0.012, gpus=(_gpu(0, 71.0, 60 * GIB, 11),),
        findings=(Advice("queue_backlog", "warning", "requests wait"),
                  Advice("output_truncation", "info", "outputs cut")),
        requests=tee,
    )  # fmt: skip
    long_reason = "process 4242 exited (SIGKILL); log: " + "x" * 120 + " [the end of the line]"
    dead = EndpointView(
        Target("dead-run", "http://127.0.0.1:8001", "opsctl-run", run_dir="/runs/r1", pid=20),
        DEAD, long_reason, Figures(), MODEL, LocalState(False, reason="exited"), None,
        999.0, 950.0, 30, 2, None,
        alerts=(FiredAlert("VllmEngineDead", "firing", "critical", None, None, None, None, None),
                FiredAlert("VllmDown", "firing", "warning", None, None, None, None, None)),
    )  # fmt: skip
    engines = (
        EngineView("0", "EngineCore_DP0", BUSY, None, 2.0, 0.0, 0.3, 50.0, 20.0),
        EngineView("1", "EngineCore_DP1", STALLED, "generation flat for 12 s", 4.0, 1.0, 0.5,
                   0.0, 0.0, flat_s=12.0),
    )  # fmt: skip
    dp = EndpointView(
        Target("dp2", "http://10.0.0.7:8000", "targets"), STALLED,
        "engine 1 (EngineCore_DP1): generation flat for 12 s",
        Figures(running=6.0, waiting=1.0, kv_usage=0.4, generation_tps=50.0, prompt_tps=0.0),
        MODEL, None, 200, 999.8, 999.8, 25, 0, 0.02, engines=engines,
    )  # fmt: skip
    stale = EndpointView(
        Target("stale", "http://10.0.0.8:8000", "argument"), READY, None,
        Figures(running=0.0, waiting=0.0, kv_usage=0.0, generation_tps=0.0), MODEL, None, 200,
        990.0, 990.0, 12, 0, 0.5,
    )  # fmt: skip
    never = EndpointView(
        Target("never", "http://10.0.0.9:8000", "discovered"), UNREACHABLE,
        "ConnectError: [Errno 111] Connection refused", Figures(), EngineInfo(), None, None,
        999.9, None, 0, 0, None,
    )  # fmt: skip
    answered_once = EndpointView(
        Target("remote-ok", "http://10.0.0.10:8000", "targets"), READY, None,
        Figures(running=0.0), EngineInfo(), None, 200, 999.0, None, 3, 0, 0.01,
    )  # fmt: skip
    return busy, dead, dp, stale, never, answered_once


NOTES = {"http://127.0.0.1:8001": "dead: b bundles its run",
         "http://10.0.0.7:8000": "invariance FAIL " + "y" * 80}  # fmt: skip
GPU_HOST = HostGpus(NOW, "nvml", (_gpu(0, 71.0, 60 * GIB, 11), _gpu(1, None, None, 99)))
NO_GPU_HOST = HostGpus(NOW, None, (), "no GPU")


def rendered() -> str:
    """Every surface's bytes, one section each."""
    from opsctl.console.report import render_plain
    from opsctl.console.view_panel import row_cells
    from opsctl.output import PIPE_WIDTH, PlainConsole

    views = fleet()
    out = ["== TUI cells (row_cells)"]
    for v in views:
        out.append(json.dumps(row_cells(v, NOW, INTERVAL, NOTES.get(v.target.url, ""))))
    for host_name, host in (("GPU host", GPU_HOST), ("no GPU", NO_GPU_HOST), ("none", None)):
        snap = FleetSnapshot(NOW, views, INTERVAL, host_gpus=host)
        pipe = io.StringIO()
        render_plain(PlainConsole(file=pipe, soft_wrap=True, width=PIPE_WIDTH), snap)
        out += [f"== --once piped ({host_name})", pipe.getvalue()]
        term = io.StringIO()
        console = Console(file=term, width=400, force_terminal=True, color_system="standard")
        render_plain(console, snap)
        out += [f"== --once terminal ({host_name})", term.getvalue()]
    return "\n".join(out) + "\n"


def test_the_fleet_table_is_the_recorded_bytes():
    assert rendered() == GOLDEN.read_text(encoding="utf-8")


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(rendered(), encoding="utf-8")
