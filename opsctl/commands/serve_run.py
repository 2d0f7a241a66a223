"""The body of `opsctl serve`, kept apart from the Typer declaration."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from opsctl import output
from opsctl.errors import EngineDied
from opsctl.exit_codes import ExitCode


@dataclass
class ServeRequest:
    model: str | None
    load_format: str
    host: str
    port: int
    timeout: float
    tui: bool | None
    as_json: bool
    extra: list[str] = field(default_factory=list)
    api_key: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)  # test-only (hidden flag)


def _json_line(event: str, **fields) -> None:
    print(json.dumps(output.document("serve", event=event, **fields), default=str), flush=True)


def run_serve(req: ServeRequest) -> int:
    """Start, supervise, stop. SIGINT/SIGTERM/SIGHUP (opsctl.engine.lifetime) end in the
    same orderly stop and exit 0; the server never outlives this process."""
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    tui = output.want_tui(req.tui, req.as_json)
    model = resolve(req.model)
    opts = LaunchOptions(
        model=model,
        load_format=req.load_format,
        host=req.host,
        port=req.port,
        extra_args=req.extra,
        api_key=req.api_key,
        knobs=dict(req.knobs),
    )
    server = EngineServer(opts)
    try:
        server.start()
        output.info(
            f"starting vLLM on {model.name} ({req.load_format} weights); run dir {server.run_dir}"
        )
        if tui:
            from opsctl.ui.serve_app import run_dashboard

            return run_dashboard(server, req.timeout)
        return _run_plain(server, req)
    except KeyboardInterrupt:  # Ctrl-C, or lifetime.Terminated (SIGTERM, SIGHUP)
        report = server.stop()
        output.info(f"stopped in {report.seconds:.1f} s")
        return int(ExitCode.OK)
    finally:
        report = server.stop()
        if report.leftover_pids:
            output.warn(f"processes still alive after stop: {report.leftover_pids}")
        if req.as_json and server.proc is not None:
            _json_line(
                "stopped",
                seconds=report.seconds,
                signals=report.signals,
                leftover_pids=report.leftover_pids,
                shm_removed=report.shm_removed,
                exit_code=report.exit_code,
            )


def _run_plain(server, req: ServeRequest) -> int:
    from opsctl.collectors.processes import snapshot_tree
    from opsctl.domain.serverlog import decisive_lines, load_progress

    last_phase = [""]

    def tick(s) -> None:
        phase = load_progress(s.log_text()).phase
        if phase != last_phase[0]:
            last_phase[0] = phase
            output.info(f"  [{time.time() - s.started_at:5.1f}s] {phase}")

    load_s = server.wait_healthy(req.timeout, tick)
    tree = snapshot_tree(server.pid)
    pids = {p.role: p.pid for p in tree.processes}
    if req.as_json:
        _json_line(
            "ready",
            url=server.url,
            model=server.opts.model.name,
            load_format=req.load_format,
            run_dir=str(server.run_dir),
            pid=server.pid,
            pids=pids,
            load_seconds=round(load_s, 2),
        )
    else:
        print(
            f"ready: {server.url}  (healthy after {load_s:.1f} s; run dir {server.run_dir})",
            flush=True,
        )
    output.info("Ctrl-C stops the server")
    while True:
        time.sleep(1.0)
        server.track()
        if server.exited() is not None:
            lines = decisive_lines(server.log_text())
            raise EngineDied(
                f"engine died (exit code {server.exited()}): "
                + (" | ".join(lines) or "no error line in the log"),
                hint=f"log: {server.log_path}",
            )
