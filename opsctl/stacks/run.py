"""`opsctl stacks` as a library call: where every process of a local vLLM server waits.

Each process (API server, EngineCore, workers) is labelled with its role; its stacks
are taken without stopping the engine (opsctl.stacks.collect), and identical stacks are
grouped (opsctl.stacks.judge).

``run(target, Options, progress) -> Report`` (schema ``opsctl.stacks/2``). ``target`` is
a URL (this node's only), an opsctl run (its directory or its name under the runs
directory) or a pid (of any process of a vLLM server tree). Bad input (a URL of another
host: stacks are local only; a pid that is not vLLM) is BadInput (exit 2); a run that
has finished, or a URL no local process serves, is EngineUnreachable (exit 3).

The stacks are taken twice, ``interval`` apart, and judged by
opsctl.stacks.judge_verdict: verdict ``pass`` (exit 0: idle or working), ``stuck`` (a
process stopped or stuck, or ranks held in a collective: the headline names the culprit
and the frame the others wait in), ``incomplete`` (a process could not be read and
nothing read is stuck: nothing is cleared), ``fail`` (nothing could be read); each exits
1. The document records the host (``--host`` names it otherwise), so the reports of the
hosts of one server merge into one verdict: ``merge(files)`` (schema
``opsctl.stacks.merge/1``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from opsctl.checks import events as ev
from opsctl.checks.report import Report
from opsctl.errors import BadInput, EngineUnreachable
from opsctl.stacks import judge, judge_verdict

TITLE = "stacks"
MERGED = "stacks.merge/1"


@dataclass(frozen=True, slots=True)
class Options:
    """How long to wait for the dumps, native frames or not, the takes' interval, the host."""

    timeout: float = 5.0  # seconds for the dumps to arrive (per call of py-spy too)
    native: bool = False  # py-spy --native: C frames too (CUDA syncs, collectives, locks)
    interval: float = 1.0  # seconds between the two takes (a stuck thread stays put)
    host: str | None = None  # this host's name in the report (None: the machine's)


def host_name() -> str:
    """This machine's host name, as a report records it."""
    import socket

    return socket.gethostname()


def _is_vllm(pid: int) -> bool:
    import psutil

    try:
        p = psutil.Process(pid)
        text = f"{p.name()} {' '.join(p.cmdline())}"
    except psutil.Error:
        return False
    return "vllm" in text.lower() or "EngineCore" in text


def root_of(pid: int) -> int:
    """The topmost vLLM process above ``pid`` (an EngineCore's API server)."""
    import psutil

    root = pid
    try:
        parent = psutil.Process(pid).parent()
        while parent is not None and _is_vllm(parent.pid):
            root, parent = parent.pid, parent.parent()
    except psutil.Error:
        pass
    return root


def _run_meta(run_dir: Path) -> dict:
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        raise BadInput(
            f"{run_dir} is not an opsctl run directory (no readable meta.json)"
        ) from None
    return meta if isinstance(meta, dict) else {}


def resolve(target: str) -> tuple[int, Path | None]:
    """(the API server's pid, the run directory or None) of ``target``."""
    import psutil

    from opsctl.collectors.processes import listening_pid
    from opsctl.collectors.runs import find_run_dir
    from opsctl.paths import runs_dir

    if target.isdigit():
        pid = int(target)
        if not psutil.pid_exists(pid):
            raise EngineUnreachable(f"no process {pid}")
        if not _is_vllm(pid):
            raise BadInput(f"pid {pid} is not a vLLM server process")
        root = root_of(pid)
        return root, _run_of(root)
    if "://" in target or (":" in target and not Path(target).exists()):
        from opsctl.domain.urls import loopback_port, normalise_url

        url = normalise_url(target)
        port = loopback_port(url)
        if port is None:
            raise BadInput(
                f"stacks are local only: {url} is another host's (run opsctl stacks there)"
            )
        run = find_run_dir(url)
        pid = _run_meta(run).get("pid") if run else listening_pid(port or 80)
        if not pid:
            raise EngineUnreachable(f"no local process serves {url}")
        return int(pid), run
    run = Path(target) if Path(target).is_dir() else runs_dir() / target
    if not run.is_dir():
        raise BadInput(f"{target!r} is neither a URL, a pid nor an opsctl run")
    meta = _run_meta(run)
    pid = int(meta.get("pid") or 0)
    if meta.get("stopped_at") or not pid or not psutil.pid_exists(pid):
        raise EngineUnreachable(f"run {run.name} has finished: no engine to take stacks of")
    return pid, run


def _run_of(pid: int) -> Path | None:
    from opsctl.collectors.jsonfile import json_object
    from opsctl.paths import runs_dir

    for meta_path in runs_dir().glob("*/meta.json"):
        meta = json_object(meta_path)
        if meta.get("pid") == pid and not meta.get("stopped_at"):
            return meta_path.parent
    return None


def run(target: str, options: Options = Options(), progress: ev.Progress = ev.ignore) -> Report:
    """The stacks of every process of ``target``'s server tree; see the module doc."""
    from dataclasses import replace

    from opsctl.output import document
    from opsctl.stacks.collect import take

    progress(ev.Started(TITLE, target))
    pid, run_dir = resolve(target)
    host = options.host or host_name()
    progress(
        ev.Phase(f"taking the stacks of the tree of pid {pid} twice, {options.interval:g} s apart")
    )
    t0 = time.monotonic()
    procs = take(
        pid, run_dir, timeout=options.timeout, native=options.native, interval=options.interval
    )
    procs = [replace(p, host=host) for p in procs]
    seconds = round(time.monotonic() - t0, 3)
    found = judge_verdict.diagnose(procs)
    doc = document(
        judge.SCHEMA,
        target=target,
        host=host,
        pid=pid,
        run_dir=str(run_dir) if run_dir else None,
        taken_at=round(time.time(), 3),
        seconds=seconds,
        interval=options.interval,
        **found.fields(),
        processes=[p.to_dict() for p in procs],
        groups=[g.to_dict() for g in judge.group(procs)],
    )
    lines = tuple((p.verdict(),) for p in procs)
    progress(ev.Finished(found.verdict, found.headline, lines))
    return Report(found.verdict, doc)


def merge(files: list[str], progress: ev.Progress = ev.ignore) -> Report:
    """One verdict over the ``stacks --json`` reports of several hosts (``files``).

    Every rank keyed by host and role; BadInput (exit 2) for a file that is not such a
    report, or two reports of one host's same rank."""
    from opsctl.collectors.jsonfile import load_json_object
    from opsctl.output import document

    if len(files) < 2:
        raise BadInput("--merge takes two reports or more (opsctl stacks --json of each host)")
    progress(ev.Started(TITLE, ", ".join(files)))
    docs = [(f, load_json_object(Path(f))) for f in files]
    try:
        procs, reports = judge_verdict.merge(docs)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    found = judge_verdict.diagnose(procs)
    doc = document(
        MERGED,
        reports=reports,
        hosts=sorted({r["host"] for r in reports}),
        **found.fields(),
        processes=[p.to_dict() for p in procs],
        groups=[g.to_dict() for g in judge.group(procs)],
    )
    progress(ev.Finished(found.verdict, found.headline, ()))
    return Report(found.verdict, doc)
