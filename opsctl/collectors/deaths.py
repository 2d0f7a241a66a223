"""Read what a run directory says about its processes' ends, for the rank that died first.

The files (never a raise: a missing or torn file is no facts):

- ``exits.jsonl``: each vLLM process's record of its children's ends
  (``engine_patches.exits``);
- ``ledger/*.json``: every vLLM process's title (its rank) and parent;
- ``meta.json``: the API server's pid, every pid of the run with its start time, and what
  opsctl's supervision noted (``ranks``: pid -> role seen, ``seen_gone``: pid -> when it
  disappeared, ``api_exit``: the API server's exit code and when it was seen), and when a
  stop began (``stopped_at`` minus ``stop.seconds``);
- ``server.log``: the ``(ROLE pid=N)`` lines.

The judgement is :func:`opsctl.domain.deaths.first_death`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from opsctl.collectors import ledger
from opsctl.collectors.jsonfile import run_meta
from opsctl.domain import deaths, ranks
from opsctl.domain.runs import same_process

EXITS = "exits.jsonl"
LOG_TAIL = 8 * 1024 * 1024  # bytes of server.log read (its end)


def read_exits(run_dir: Path) -> list[dict]:
    """The exit records of the run (one JSON object a line; a torn line skipped)."""
    try:
        text = (run_dir / EXITS).read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_log(run_dir: Path, limit: int = LOG_TAIL) -> str:
    """The end of the run's server.log (``""`` when there is none)."""
    try:
        with (run_dir / "server.log").open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def roles(run_dir: Path, log: str, seen: Mapping[int, str] | None = None) -> dict[int, str]:
    """pid -> rank role: the log's prefixes, then what opsctl saw, then the ledger's titles."""
    out = deaths.roles_from_log(log)
    meta_roles = run_meta(run_dir).get("ranks") or {}
    out.update({int(k): str(v) for k, v in meta_roles.items() if str(k).isdigit()})
    out.update(dict(seen or {}))
    out.update(ranks.record_roles(ledger.read_records(run_dir)))
    return out


def _alive(pids: Mapping[int, float | None]) -> set[int]:
    """Which of the recorded processes (pid -> start time) still run (not zombies)."""
    out = set()
    for pid, started in pids.items():
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and same_process(started, p.create_time()):
                out.add(pid)
        except psutil.Error:
            continue
    return out


def _stop_began(meta: Mapping[str, Any]) -> float | None:
    """When opsctl began stopping the run (its stop, or a reap of the orphan): the ends
    after that are its doing, not a death."""
    began = []
    for at, report, key in (("stopped_at", "stop", "seconds"), ("reaped_at", "reap", "duration_s")):
        when, rep = meta.get(at), meta.get(report)
        if isinstance(when, (int, float)):
            took = rep.get(key) if isinstance(rep, dict) else 0
            began.append(float(when) - float(took if isinstance(took, (int, float)) else 0))
    return min(began) if began else None


def of_run(
    run_dir: Path,
    *,
    api: tuple[int, int | None, float | None] | None = None,
    gone: Mapping[int, float] | None = None,
    seen: Mapping[int, str] | None = None,
    serving: bool | None = None,
    log: str | None = None,
) -> deaths.FirstDeath | None:
    """The first rank death of the run in ``run_dir``; None when no rank ended.

    opsctl's supervision passes what it holds in memory (``api``: the API server's pid,
    exit code and when seen; ``gone``; ``seen`` roles); anyone else gets them from
    meta.json."""
    meta = run_meta(run_dir)
    exits = read_exits(run_dir)
    gone_meta = {
        int(k): float(v)
        for k, v in (meta.get("seen_gone") or {}).items()
        if str(k).isdigit() and isinstance(v, (int, float))
    }
    gone = {**gone_meta, **dict(gone or {})}
    if not exits and not gone and api is None and not meta.get("api_exit"):
        return None  # nothing ended: no need to read the log or the ledger
    if api is None:
        api = _api(meta)
    text = read_log(run_dir) if log is None else log
    pids = {int(k): v for k, v in (meta.get("pids") or {}).items() if str(k).isdigit()}
    return deaths.first_death(
        exits,
        roles(run_dir, text, seen),
        gone=gone,
        api=api,
        alive=_alive(pids),
        log=text,
        before=_stop_began(meta),
        serving=serving,
    )


def _api(meta: Mapping[str, Any]) -> tuple[int, int | None, float | None] | None:
    """(pid, exit code, when seen) of the run's API server from meta.json."""
    try:
        pid = int(meta.get("pid") or 0)
    except (TypeError, ValueError):
        return None
    if not pid:
        return None
    ended = meta.get("api_exit") if isinstance(meta.get("api_exit"), dict) else {}
    code, when = ended.get("exitcode"), ended.get("time")
    return (
        pid,
        code if isinstance(code, int) else None,
        float(when) if isinstance(when, (int, float)) else None,
    )


def of_url(
    url: str, root: Path | None = None, within_s: float = 3600.0
) -> deaths.FirstDeath | None:
    """The first rank death of the newest opsctl run served at ``url`` (None: none).

    For ``opsctl status`` and the like: the newest run whose meta.json names ``url``, if
    its API server still runs or the run's records changed within ``within_s`` seconds
    (an old run at a reused port is no news). None for a server opsctl did not start."""
    import time

    from opsctl import paths

    base = paths.runs_dir() if root is None else root
    best: tuple[float, Path] | None = None
    for meta_path in base.glob("*/meta.json"):
        meta = run_meta(meta_path.parent)
        started = meta.get("started_at")
        if str(meta.get("url", "")).rstrip("/") != url.rstrip("/"):
            continue
        if isinstance(started, (int, float)) and (best is None or started > best[0]):
            best = (float(started), meta_path.parent)
    if best is None:
        return None
    run = best[1]
    meta = run_meta(run)
    pids = {int(k): v for k, v in (meta.get("pids") or {}).items() if str(k).isdigit()}
    try:
        recent = time.time() - (run / "meta.json").stat().st_mtime <= within_s
    except OSError:
        return None
    if not recent and meta.get("pid") not in _alive(pids):
        return None
    return of_run(run)
