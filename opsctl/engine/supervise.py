"""`opsctl serve` as a library call: start one server, supervise it, stop it in order.

``serve(request, on_event, dashboard=None) -> exit code``. Without a dashboard it waits
for /health (reporting load phases), says "ready", then watches the server until it dies
(EngineDied) or a stop signal arrives. With a dashboard (a callable the caller passes,
e.g. opsctl.serve.view_app.run_dashboard) the dashboard does the watching. Either way
SIGINT/SIGTERM/SIGHUP (opsctl.engine.lifetime) end in the same orderly stop and exit 0,
and the server never outlives this process.

Events go to ``on_event(name, fields)``: "starting", "phase", "ready" (``pids``: every
process of the server, ``{pid, ppid, role, title}`` in rank order), "rank_died" (a rank
ended while the API server runs: :class:`opsctl.domain.deaths.FirstDeath` as a dict) and
"stopped" (``first_death``: the rank that ended first on its own, how, its last log lines
and what the other ranks did; null when none did).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opsctl.domain import ranks
from opsctl.domain.deaths import FirstDeath
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
    death: FirstDeath | None = None  # what ended on its own, judged before opsctl's stop
    try:
        server.start()
        on_event("starting", {"model": model.name, "run_dir": str(server.run_dir)})
        if dashboard is not None:
            return dashboard(server, req.timeout)
        return _watch(server, req, on_event)
    except KeyboardInterrupt:  # Ctrl-C, or lifetime.Terminated (SIGTERM, SIGHUP)
        death = first_death(server)
        server.stop()
        return int(ExitCode.OK)
    finally:
        if getattr(server, "stop_report", None) is None:
            death = first_death(server)
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
                    "first_death": death.to_dict() if death is not None else None,
                },
            )


def first_death(server: EngineServer, serving: bool | None = None) -> FirstDeath | None:
    """The server's rank that ended first (None: none, or a stand-in server); never raises."""
    if server.proc is None or not hasattr(server, "first_death"):
        return None
    try:
        return server.first_death(serving)
    except Exception:  # the verdict must never keep the server from being stopped
        return None


def process_list(tree) -> list[dict[str, Any]]:
    """The ready event's processes: ``{pid, ppid, role, title}`` in rank order."""
    return [
        {"pid": p.pid, "ppid": p.ppid, "role": p.role, "title": p.cmdline.split(" ", 1)[0]}
        for p in ranks.by_rank(tree.processes, lambda p: p.role)
    ]


def died_error(server: EngineServer) -> EngineDied:
    """The error of a server that died while serving.

    The rank that died first, how, its last log lines and what the others did (else the
    log's decisive lines)."""
    from opsctl.domain.serverlog import decisive_lines

    server.track()  # the API server's end, noted before the verdict
    death = first_death(server)
    lines = decisive_lines(server.launch_log_text())
    decisive = " | ".join(lines) or "no error line in the log"
    hint = f"log: {server.log_path}"
    if death is None:
        return EngineDied(f"engine died (exit code {server.exited()}): {decisive}", hint=hint)
    text = f"engine died: {death.summary()}"
    if death.last_lines:
        text += f"; last lines of {death.role}: " + " / ".join(death.last_lines)
    if death.role.startswith(ranks.API_SERVER):
        text += f" | {decisive}"
    return EngineDied(text, hint=hint)


def _watch(server: EngineServer, req: ServeRequest, on_event: OnEvent) -> int:
    from opsctl.collectors.processes import snapshot_tree
    from opsctl.domain.serverlog import load_progress

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
            "pids": process_list(tree),
            "healthy_after_s": round(load_s, 2),
            "eager": req.eager,
            "single_process": req.single_process,
        },
    )
    told: set[int] = set()
    while True:
        time.sleep(1.0)
        server.track()
        if server.exited() is not None:
            raise died_error(server)
        _tell_rank_death(server, on_event, told)


def _tell_rank_death(server: EngineServer, on_event: OnEvent, told: set[int]) -> None:
    """A rank ended while the API server runs (vLLM may keep serving without it): say so
    once per first death ("rank_died")."""
    if not server.rank_ended():
        return
    import httpx

    from opsctl.collectors import http

    with httpx.Client(verify=http.tls_context()) as client:
        serving = server.health(client)
    death = first_death(server, serving=serving)
    if death is not None and death.pid not in told:
        told.add(death.pid)
        on_event("rank_died", death.to_dict())
