"""Discovery of local vLLM OpenAI servers: opsctl's runs and vLLM API processes.

opsctl's live runs are read from <OPSCTL_HOME>/runs/*/meta.json; any process whose
command line is vLLM's API server is found with the port it listens on (psutil). Also
the cheap per-poll liveness check of a local endpoint."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import psutil

from opsctl.collectors import deaths
from opsctl.collectors.processes import process_roles, stopped_members
from opsctl.console.judge import LocalState, Target
from opsctl.domain.serverlog import decisive_lines, load_progress
from opsctl.domain.urls import loopback_port

API_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
_PID_TOLERANCE = 1.0  # seconds between psutil's create_time reads


def is_api_server(cmdline: list[str]) -> bool:
    """Whether a command line is vLLM's OpenAI API server.

    `python -m vllm.entrypoints.openai.api_server ...`, `vllm serve ...`,
    `python -m vllm.entrypoints.cli.main serve ...`."""
    if not cmdline:
        return False
    if any(m in cmdline for m in API_MODULES):
        return "vllm.entrypoints.cli.main" not in cmdline or "serve" in cmdline
    # `vllm serve`, or the script run by an interpreter: `python /venv/bin/vllm serve`
    i = 1 if Path(cmdline[0]).name.startswith("python") else 0
    return len(cmdline) > i + 1 and Path(cmdline[i]).name == "vllm" and cmdline[i + 1] == "serve"


def _argv_value(cmdline: list[str], flag: str) -> str | None:
    for i, arg in enumerate(cmdline):
        if arg == flag and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def listening_port(proc: psutil.Process, cmdline: list[str]) -> int | None:
    """The TCP port the API server listens on (else the --port of its argv).

    The --port in its argv when it does not listen yet (starting) or when several are
    open."""
    wanted = _argv_value(cmdline, "--port")
    ports: set[int] = set()
    with contextlib.suppress(psutil.Error):
        for c in proc.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr:
                ports.add(c.laddr.port)
    if wanted and wanted.isdigit() and (not ports or int(wanted) in ports):
        return int(wanted)
    if ports:
        return min(ports)
    return 8000 if wanted is None else None


def _host(cmdline: list[str]) -> str:
    host = _argv_value(cmdline, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _topmost(procs: dict[int, tuple[psutil.Process, list[str]]]) -> list[int]:
    """API-server matches whose parent is not itself a match (forked children share it)."""
    out = []
    for pid, (p, _) in procs.items():
        try:
            parent = p.ppid()
        except psutil.Error:
            continue
        if parent not in procs:
            out.append(pid)
    return out


def discover_processes() -> list[Target]:
    """Targets of the vLLM API server processes on this host (topmost of each tree)."""
    found: dict[int, tuple[psutil.Process, list[str]]] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if is_api_server(cmd):
            found[p.pid] = (p, cmd)
    out = []
    for pid in _topmost(found):
        p, cmd = found[pid]
        try:
            started = p.create_time()
        except psutil.Error:
            continue
        port = listening_port(p, cmd)
        if port is None:
            continue
        url = f"http://{_host(cmd)}:{port}"
        out.append(Target(f"pid {pid}", url, "discovered", pid=pid, pid_started=started))
    return out


def _same_process(pid: int, started: float | None) -> bool:
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(p.create_time() - started) < _PID_TOLERANCE
    except psutil.Error:
        return False


def discover_runs(runs_root: Path) -> list[Target]:
    """Targets of the opsctl runs whose API server or owner still lives.

    A run that died under a live `opsctl serve` is shown dead, with its log lines."""
    out = []
    for meta_path in sorted(runs_root.glob("*/meta.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("stopped_at") or not meta.get("url"):
            continue
        pid = int(meta.get("pid") or 0)
        started = (meta.get("pids") or {}).get(str(pid))
        owner = int(meta.get("owner_pid") or 0)
        alive = pid > 0 and _same_process(pid, started)
        if not alive and not (owner and _same_process(owner, meta.get("owner_started"))):
            continue
        name = f"{meta.get('model', 'run')}@{meta_path.parent.name}"
        out.append(
            Target(name, str(meta["url"]).rstrip("/"), "opsctl-run", pid=pid or None,
                   pid_started=started, run_dir=str(meta_path.parent))
        )  # fmt: skip
    return out


def discover(runs_root: Path) -> list[Target]:
    """Every local server: opsctl's runs, then other vLLM API processes."""
    return [*discover_runs(runs_root), *discover_processes()]


def local_targets(urls: list[str], runs_root: Path) -> dict[str, Target]:
    """For each URL of this node, the local server that answers there.

    That server is an opsctl run, else a discovered vLLM process, with its API server's
    pid; one scan for them all. Identifies given targets: it adds no other server."""
    wanted = {u: port for u in urls if (port := loopback_port(u)) is not None}
    if not wanted:
        return {}
    by_port: dict[int, Target] = {}
    for t in discover_runs(runs_root):
        port = loopback_port(t.url)
        if t.pid and port is not None:
            by_port.setdefault(port, t)
    if set(wanted.values()) - set(by_port):
        for t in discover_processes():
            port = loopback_port(t.url)
            if port is not None:
                by_port.setdefault(port, t)
    return {u: by_port[port] for u, port in wanted.items() if port in by_port}


def local_target(url: str, runs_root: Path) -> Target | None:
    """:func:`local_targets` for one URL."""
    return local_targets([url], runs_root).get(url)


def _log_facts(run_dir: str | None, dead: bool) -> tuple[str | None, tuple[str, ...]]:
    if not run_dir:
        return None, ()
    try:
        log = (Path(run_dir) / "server.log").read_text(errors="replace")
    except OSError:
        return None, ()
    phase = load_progress(log).phase
    return phase, tuple(decisive_lines(log)) if dead else ()


# run dir -> ((exits.jsonl size, API server alive), the first death's summary): judged
# again only when a new exit was recorded or the API server died
_DEATHS: dict[str, tuple[tuple[int, bool], str | None]] = {}


def first_death(run_dir: str | None, alive: bool) -> str | None:
    """The summary of an opsctl run's first rank death (None: none, or not an opsctl run).

    Read from the run's exit records, ledger, meta.json and log (opsctl.collectors.deaths);
    a live server is judged only once an exit was recorded."""
    if not run_dir:
        return None
    try:
        size = (Path(run_dir) / deaths.EXITS).stat().st_size
    except OSError:
        size = 0
    if alive and not size:
        return None
    key = (size, alive)
    cached = _DEATHS.get(run_dir)
    if cached is not None and cached[0] == key:
        return cached[1]
    found = deaths.of_run(Path(run_dir))
    summary = found.summary() if found is not None else None
    _DEATHS[run_dir] = (key, summary)
    return summary


def local_state(
    target: Target, with_roles: bool = False, with_log: bool = False
) -> LocalState | None:
    """Liveness of a local endpoint's API server; None for a remote endpoint.

    Also the roles of its processes when asked; for opsctl runs, when asked or dead, the
    load phase and the decisive lines of its log."""
    if target.pid is None:
        return None
    alive = _same_process(target.pid, target.pid_started)
    phase, lines = (
        _log_facts(target.run_dir, dead=not alive) if with_log or not alive else (None, ())
    )
    roles = process_roles(target.pid) if alive and with_roles else ()
    reason = None if alive else f"process {target.pid} exited"
    stopped = stopped_members(target.pid) if alive else ()
    death = first_death(target.run_dir, alive)
    if death:  # a dead reason (the API server's exit, an EngineCore gone) names it first
        lines = (death, *lines)
    return LocalState(alive, reason, roles, phase, lines, stopped, death)
