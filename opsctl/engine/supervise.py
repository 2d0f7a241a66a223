"""`opsctl serve` as a library call: start one server, supervise it, stop it in order.

``serve(request, on_event, dashboard=None) -> exit code``. Without a dashboard it waits
for /health (reporting load phases), says "ready", then watches the server until it dies
(EngineDied) or a stop signal arrives. With a dashboard (a callable the caller passes,
e.g. opsctl.ui.serve_app.run_dashboard) the dashboard does the watching. Either way
SIGINT/SIGTERM/SIGHUP (opsctl.engine.lifetime) end in the same orderly stop and exit 0,
and the server never outlives this process.

Events go to ``on_event(name, fields)``: "starting", "phase", "ready", "stopped".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opsctl.engine import server as srv
from opsctl.engine.server import EngineServer, LaunchOptions, reachable_url
from opsctl.errors import EngineDied
from opsctl.exit_codes import ExitCode

OnEvent = Callable[[str, dict[str, Any]], None]
Dashboard = Callable[[EngineServer, float], int]


@dataclass(frozen=True)
class ServeRequest:
    """What ``opsctl serve`` was asked to start: model, load format, address, timeout, args."""

    model: str | None
    load_format: str = "auto"
    host: str = "127.0.0.1"
    port: int | None = 8000
    timeout: float = 300.0
    extra: tuple[str, ...] = ()
    api_key: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)  # test-only (hidden flag)
    # vLLM's default execution mode (torch.compile, CUDA graphs) unless asked to run eager
    eager: bool = False
    # vLLM's process layout unless asked: True runs the model in the EngineCore
    single_process: bool = False


def serve(req: ServeRequest, on_event: OnEvent, dashboard: Dashboard | None = None) -> int:
    """Start the requested server, supervise it until it stops; the exit code."""
    from opsctl.engine.model import resolve

    model = resolve(req.model)
    server = srv.EngineServer(  # looked up at call time (tests replace it)
        LaunchOptions(
            model=model,
            load_format=req.load_format,
            host=req.host,
            port=req.port,
            extra_args=list(req.extra),
            api_key=req.api_key,
            knobs=dict(req.knobs),
            enforce_eager=req.eager,
            single_process=req.single_process,
        )
    )
    try:
        server.start()
        on_event("starting", {"model": model.name, "run_dir": str(server.run_dir)})
        if dashboard is not None:
            return dashboard(server, req.timeout)
        return _watch(server, req, on_event)
    except KeyboardInterrupt:  # Ctrl-C, or lifetime.Terminated (SIGTERM, SIGHUP)
        server.stop()
        return int(ExitCode.OK)
    finally:
        report = server.stop()
        if server.proc is not None:
            on_event(
                "stopped",
                {
                    "duration_s": report.seconds,
                    "signals": report.signals,
                    "leftover_pids": report.leftover_pids,
                    "shm_removed": report.shm_removed,
                    "exit_code": report.exit_code,
                },
            )


def _watch(server: EngineServer, req: ServeRequest, on_event: OnEvent) -> int:
    from opsctl.collectors.processes import snapshot_tree
    from opsctl.domain.serverlog import decisive_lines, load_progress

    last_phase = [""]

    def tick(s: EngineServer) -> None:
        phase = load_progress(s.launch_log_text()).phase
        if phase != last_phase[0]:
            last_phase[0] = phase
            on_event("phase", {"phase": phase, "elapsed": round(time.time() - s.started_at, 1)})

    load_s = server.wait_healthy(req.timeout, tick)
    tree = snapshot_tree(server.pid)
    on_event(
        "ready",
        {
            "url": server.url,
            "reachable_url": reachable_url(req.host, server.port),
            "model": server.opts.model.name,
            "load_format": req.load_format,
            "run_dir": str(server.run_dir),
            "pid": server.pid,
            "pids": {p.role: p.pid for p in tree.processes},
            "healthy_after_s": round(load_s, 2),
            "eager": req.eager,
            "single_process": req.single_process,
        },
    )
    while True:
        time.sleep(1.0)
        server.track()
        if server.exited() is not None:
            lines = decisive_lines(server.launch_log_text())
            raise EngineDied(
                f"engine died (exit code {server.exited()}): "
                + (" | ".join(lines) or "no error line in the log"),
                hint=f"log: {server.log_path}",
            )
