"""Servers the console starts, stops and restarts, under serve's lifetime policy.

- :meth:`ServerManager.start`: an :class:`~opsctl.engine.server.EngineServer` in THIS
  process (an embedded model or a model directory, dummy or real weights), started and
  waited for in a worker thread. It is registered for ``stop_all`` like every engine
  opsctl starts, so it dies with the console (:meth:`close` on exit, ``stop_all`` on
  every way out, the engine's owner watchdog if opsctl is killed).
- :meth:`stop` / :meth:`restart` of a server this console started: its EngineServer's
  orderly stop; a restart starts it again with the same launch options and port.
- a server another opsctl process started: stopped through its run directory (pids AND
  start times of meta.json, :func:`opsctl.collectors.run_stop.stop_run`); it is not
  restarted here: meta.json does not record its environment (API key, probes, knobs),
  so a restart would be a guess.
Blocking calls; the UI runs them in worker threads. ``on_change(managed)`` is called
from those threads on every state change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from opsctl.domain.weights import load_format_of
from opsctl.errors import BadInput


@dataclass(frozen=True, slots=True)
class StartRequest:
    """What the console's start dialog asks for: model, weights, port and limits."""

    model: str = "tiny-llama"  # embedded name or model directory
    weights: str = "dummy"  # dummy | real
    port: int | None = None  # None: a free port
    host: str = "127.0.0.1"
    max_model_len: int = 256
    max_num_seqs: int = 8
    api_key: str | None = None
    timeout: float = 300.0

    def __post_init__(self) -> None:
        load_format_of(self.weights)  # BadInput for an unknown word
        if self.port is not None and not 0 < self.port < 65536:
            raise BadInput(f"port {self.port} is out of range 1..65535")


@dataclass
class Managed:
    """One server this console started, with its state (starting ... stopped)."""

    request: StartRequest
    server: object | None = None  # EngineServer
    state: str = "starting"
    url: str | None = None
    run_dir: str | None = None
    error: str | None = None
    seconds: float | None = None
    stop_text: str | None = None
    thread: threading.Thread | None = field(default=None, repr=False)


OnChange = Callable[[Managed], None]


class ServerManager:
    """The servers this console starts and stops, each on a thread of its own.

    ``engine_factory(LaunchOptions)`` makes the server (default EngineServer; tests
    pass a stand-in with the same start / wait_healthy / stop / url / run_dir)."""

    def __init__(
        self, on_change: OnChange | None = None, engine_factory: Callable | None = None
    ) -> None:
        self.on_change = on_change or (lambda m: None)
        self.engine_factory = engine_factory
        self.managed: list[Managed] = []
        self._lock = threading.Lock()

    # ---- ours ----------------------------------------------------------------------------
    def owned(self, url: str) -> Managed | None:
        """The live server this console started at ``url``; None for another's."""
        with self._lock:
            for m in reversed(self.managed):
                if m.url == url and m.state in ("starting", "ready", "failed"):
                    return m
        return None

    def start(self, req: StartRequest) -> Managed:
        """Start a server in the background; return its record (state starting)."""
        m = Managed(req)
        with self._lock:
            self.managed.append(m)
        m.thread = threading.Thread(target=self._start, args=(m,), name="console-serve")
        m.thread.daemon = True
        m.thread.start()
        return m

    def _start(self, m: Managed) -> None:
        from opsctl.engine.model import resolve
        from opsctl.engine.server import EngineServer, LaunchOptions

        factory = self.engine_factory or EngineServer
        req = m.request
        try:
            model = resolve(req.model)
            opts = LaunchOptions(
                model=model, load_format=load_format_of(req.weights), host=req.host,
                port=req.port, max_model_len=req.max_model_len, max_num_seqs=req.max_num_seqs,
                label="console", api_key=req.api_key,
            )  # fmt: skip
            server = factory(opts)
            m.server = server
            server.start()
            m.url, m.run_dir = server.url, str(server.run_dir)
            self.on_change(m)
            m.seconds = server.wait_healthy(req.timeout)
            m.state = "ready"
        except BaseException as exc:  # shown in the console, never raised in a thread
            m.error = str(exc) or type(exc).__name__
            m.state = "failed"
            if m.server is not None:
                m.server.stop()  # type: ignore[attr-defined]
        self.on_change(m)

    def stop_owned(self, m: Managed) -> str:
        """Stop a server this console started; return what the stop did, in words."""
        m.state = "stopping"
        self.on_change(m)
        report = m.server.stop() if m.server is not None else None  # type: ignore[attr-defined]
        m.state = "stopped"
        if report is None:
            m.stop_text = "nothing was running"
        else:
            left = f", {len(report.leftover_pids)} LEFT" if report.leftover_pids else ""
            m.stop_text = f"stopped in {report.seconds:.1f} s ({', '.join(report.signals)}){left}"
        self.on_change(m)
        return m.stop_text

    def restart_owned(self, m: Managed) -> Managed:
        """Stop, then start again with the same request on the same port."""
        self.stop_owned(m)
        port = m.request.port
        if port is None and m.url:
            port = int(m.url.rsplit(":", 1)[1])
        return self.start(replace(m.request, port=port))

    def close(self) -> None:
        """Stop every server this console started (console exit)."""
        with self._lock:
            live = [m for m in self.managed if m.server is not None and m.state != "stopped"]
        for m in live:
            m.server.stop()  # type: ignore[attr-defined]
            m.state = "stopped"


def stop_foreign(run_dir: str, grace: float = 15.0) -> str:
    """Stop the engine of a run another opsctl started; one line saying how it went."""
    from opsctl.collectors.run_stop import stop_run

    rep = stop_run(Path(run_dir), grace=grace)
    if rep.error:
        raise BadInput(f"run {rep.run}: {rep.error}")
    return (
        f"run {rep.run}: {len(rep.pids)} process(es) stopped in {rep.seconds:.1f} s "
        f"({', '.join(rep.signals) or 'already gone'})"
    )


RESTART_FOREIGN = (
    "restart is for servers this console started: meta.json does not record the other "
    "server's environment (API key, probes, knobs); stop it here and start one with "
    ":serve MODEL, or restart it where it runs"
)
