"""run_dashboard and ServeCollector.collect over a live stand-in server: a real HTTP
endpoint (tests/standins/vllm_server.py, recorded vLLM /metrics) and a real child process in
the role of the engine. Quit -> 0, the process dies -> EngineDied (exit 1), never
healthy within the timeout -> OpsTimeout (exit 4)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsctl.engine.model import ResolvedModel
from opsctl.engine.server import EngineServer, LaunchOptions
from opsctl.errors import EngineDied, OpsTimeout
from opsctl.serve.collect import ServeCollector
from opsctl.serve.view_app import run_dashboard
from tests.standins.vllm_server import StandInFleet


def standin_engine(port: int, run_dir: Path) -> EngineServer:
    """An EngineServer whose 'engine' is a sleeping child process and whose URL is a
    stand-in endpoint (everything else is EngineServer's own code)."""
    model = ResolvedModel("tiny-llama", run_dir, "decoder", True, {})
    server = EngineServer(LaunchOptions(model=model, host="127.0.0.1", run_dir=run_dir))
    server.port, server.run_dir = port, run_dir
    (run_dir / "server.log").write_text("INFO Starting vLLM API server\n")
    server.started_at = time.time()
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    return server


def drive(until_cond, then_press: str | None = "q", timeout: float = 60.0):
    """A run_app that drives the dashboard headless: wait for the condition (deadline),
    then press a key."""

    def run_app(app) -> None:
        async def go() -> None:
            async with app.run_test(size=(140, 48)) as pilot:
                deadline = time.monotonic() + timeout
                while not until_cond(app):
                    assert time.monotonic() < deadline, "dashboard never reached the state"
                    await pilot.pause(0.05)
                if then_press and app.is_running:
                    await pilot.press(then_press)

        asyncio.run(go())

    return run_app


def test_quit_on_a_healthy_server_returns_0(tmp_path):
    with StandInFleet(["healthy"]) as fleet:
        server = standin_engine(fleet.endpoints[0].port, tmp_path)
        try:
            seen = []

            def ready(app) -> bool:
                seen.append(app.last.state if app.last else None)
                return app.last is not None and app.last.state == "ready"

            assert run_dashboard(server, 30, run_app=drive(ready)) == 0
            assert "ready" in seen
        finally:
            server.stop()


def test_engine_death_raises_engine_died(tmp_path):
    with StandInFleet(["healthy"]) as fleet:
        server = standin_engine(fleet.endpoints[0].port, tmp_path)
        (tmp_path / "server.log").write_text("ERROR EngineCore: RuntimeError: boom\n")

        def dead(app) -> bool:
            if app.last is not None and app.last.state == "ready" and server.exited() is None:
                server.proc.kill()
                server.proc.wait()
            return app.result_code == 1

        try:
            with pytest.raises(EngineDied, match="boom"):
                run_dashboard(server, 30, run_app=drive(dead))
        finally:
            server.stop()


def test_never_healthy_raises_timeout(tmp_path):
    with StandInFleet(["dead"]) as fleet:  # /health 503 forever
        server = standin_engine(fleet.endpoints[0].port, tmp_path)
        try:
            with pytest.raises(OpsTimeout, match="within 1 s"):
                run_dashboard(server, 1, run_app=drive(lambda app: not app.is_running, None))
        finally:
            server.stop()


def test_collect_reads_state_metrics_and_process_of_a_live_server(tmp_path):
    with StandInFleet(["busy"]) as fleet:
        server = standin_engine(fleet.endpoints[0].port, tmp_path)
        collector = ServeCollector(server)
        try:
            first = collector.collect()
            assert first.state == "ready" and first.metrics is not None
            assert first.metrics.running == 4.0
            assert [p.pid for p in first.tree.processes] == [server.pid]
            deadline = time.monotonic() + 30
            second = collector.collect()
            while second.metrics.generation_tps in (None, 0.0):  # rates need two scrapes
                assert time.monotonic() < deadline
                second = collector.collect()
            assert second.metrics.generation_tps > 0
            server.proc.kill()
            server.proc.wait()
            assert collector.collect().state == "dead"
        finally:
            collector.close()
            server.stop()
