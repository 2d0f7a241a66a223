"""Shared plumbing for `opsctl diag ...`: a target that is either an external URL or an
engine started with serve's machinery, reachability checks, and the run-or-TUI switch.

Every diag follows one pipeline: ``run(...)`` yields progress snapshots (dicts) and
returns a final report dict; ``--json`` prints the report, a terminal gets rich tables,
``--tui`` feeds the same snapshots into a reusable panel (opsctl.ui.panels.diag).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.errors import BadInput, EngineUnreachable


@dataclass
class Target:
    url: str
    server: object | None = None  # EngineServer when opsctl started it
    run_dir: Path | None = None
    external: bool = True
    notes: list[str] = field(default_factory=list)


def check_url(url: str) -> str:
    from opsctl.commands.status import validate_url

    return validate_url(url)


def require_reachable(url: str, timeout: float = 5.0, api_key: str | None = None) -> None:
    """A server answers at ``url`` and accepts our credentials: /health is open on vLLM,
    so a guarded endpoint (/v1/models) tells whether an API key is needed (a 401/403 is
    "authentication required", exit 3; any other answer is left to the check)."""
    import httpx

    from opsctl.collectors import http

    try:
        with http.client(api_key, timeout=timeout) as c:
            c.get(f"{url}/health")
            http.check_auth(c.get(f"{url}/v1/models"), api_key)
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"no server answered at {url}: {type(exc).__name__}") from None


def knob_warnings(run_dirs) -> tuple[dict[str, str], list[str]]:
    """Test knobs the engines of these runs honoured, read from their ledgers (the
    engine's own record), and the warning line for them ([] when none)."""
    from opsctl.collectors import ledger

    knobs: dict[str, str] = {}
    for rd in run_dirs:
        if rd:
            knobs.update(ledger.test_knobs(ledger.read_records(Path(rd))))
    line = ledger.knob_warning(knobs)
    return knobs, [line] if line else []


def knob_snapshot(run_dir) -> dict:
    """A progress snapshot carrying the knob warning for the live panel ({} when none)."""
    _, warnings = knob_warnings([run_dir])
    return {"warnings": warnings, "events": [f"warning: {w}" for w in warnings]} if warnings else {}


def add_knob_warnings(doc: dict, run_dirs) -> dict:
    """Put ``test_knobs`` and the knob warning (first in ``warnings``) into a diag report."""
    knobs, warnings = knob_warnings(run_dirs)
    doc["test_knobs"] = knobs
    doc["warnings"] = [*warnings, *doc.get("warnings", [])]
    return doc


def warn_test_knobs(doc: dict) -> None:
    """Say a report's knob warning on stderr, above the report (called by the command
    after the pipeline, never while a dashboard owns the terminal)."""
    from opsctl import output
    from opsctl.collectors.ledger import knob_warning

    line = knob_warning(doc.get("test_knobs") or {})
    if line:
        output.warn(line)


@contextlib.contextmanager
def engine_target(
    url: str | None,
    model: str | None,
    *,
    default_model: str | None = None,
    load_format: str = "auto",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    disable_patches: list[str] | None = None,
    label: str = "diag",
    timeout: float = 300.0,
    max_model_len: int = 256,
    max_num_seqs: int = 8,
    enforce_eager: bool = True,
    knobs: dict[str, str] | None = None,
    api_key: str | None = None,
) -> Iterator[Target]:
    """Yield a Target: the given URL (checked reachable) or a freshly started engine,
    stopped (with every child process and shm segment) when the block exits."""
    if url and model:
        raise BadInput("give either a URL or --model, not both")
    if url:
        base = check_url(url)
        require_reachable(base, api_key=api_key)
        yield Target(base)
        return
    from opsctl import output
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    resolved = resolve(model or default_model)
    opts = LaunchOptions(
        model=resolved,
        load_format=load_format,
        extra_args=list(extra_args or []),
        env=dict(env or {}),
        disable_patches=list(disable_patches or []),
        label=label,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enforce_eager=enforce_eager,
        knobs=dict(knobs or {}),
    )
    server = EngineServer(opts)
    try:
        server.start()
        output.info(f"starting engine {resolved.name} for {label} (run dir {server.run_dir})")
        secs = server.wait_healthy(timeout)
        output.info(f"engine healthy after {secs:.1f} s at {server.url}")
        yield Target(server.url, server, server.run_dir, external=False)
    finally:
        server.stop()


def plain_emitter(title: str):
    """An emit() for non-TUI runs: phase changes and events go to stderr."""
    from opsctl import output

    state = {"phase": None}

    def emit(snap: dict) -> None:
        phase = snap.get("phase")
        if phase and phase != state["phase"]:
            state["phase"] = phase
            output.info(f"[{title}] {phase}")
        for line in snap.get("events", []):
            output.info(f"  {line}")

    return emit


def run_pipeline(title: str, pipeline, *, tui: bool | None, as_json: bool) -> dict:
    """Run ``pipeline(emit) -> report`` plainly or under the dashboard; return the report."""

    from opsctl.output import want_tui

    use_tui = want_tui(bool(tui), as_json) if tui else False
    if not use_tui:
        return pipeline(plain_emitter(title))
    from opsctl.engine import lifetime
    from opsctl.ui.diag_app import DiagApp

    app = DiagApp(title, pipeline)
    with lifetime.tui_app(app.exit_from_signal):
        app.run()
    lifetime.raise_if_received()
    if app.error is not None:
        raise app.error
    if app.report is None:
        raise KeyboardInterrupt
    return app.report


def find_run_dir(url: str) -> Path | None:
    """The run directory of the live engine opsctl started at ``url``: its meta.json names
    that URL, it has not stopped, and its recorded pid is still alive; the newest wins.
    None when there is none (an engine not started by opsctl, or a dead one)."""
    import json

    import psutil

    from opsctl import paths

    best: tuple[float, Path] | None = None
    for meta_path in paths.runs_dir().glob("*/meta.json"):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if str(meta.get("url", "")).rstrip("/") != url.rstrip("/") or meta.get("stopped_at"):
            continue
        pid = meta.get("pid")
        if not isinstance(pid, int) or not psutil.pid_exists(pid):
            continue
        try:
            started = float(meta.get("started_at") or 0)
        except (TypeError, ValueError):
            started = 0.0
        if best is None or started > best[0]:
            best = (started, meta_path.parent)
    return best[1] if best else None
