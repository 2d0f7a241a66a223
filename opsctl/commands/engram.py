"""`opsctl engram inspect | plan | clean`: DeepSeek V4.1 Engram host tables.

- ``inspect``: every ``vllm_engram_*`` table on this node, as a /dev/shm file and/or as
  (deleted) mappings held by live processes; size, weight/scale split, mappers with
  RSS/PSS of that mapping, linked or not, the scale block size (vLLM 0.32 uses 32;
  128 is recognised) and how it was decided, fill verification, /dev/shm capacity.
  Exit 0 when every table verifies; 1 on a fill mismatch, or when verification was
  requested but could not complete for some table (permission, read error, unknown
  size or layout).
- ``plan``: table bytes per rank and per node for a TP/DP layout, shared vs private, and
  whether /dev/shm (or ``--shm-size``) holds them (vLLM's fallback decision).
- ``clean``: orphaned ``vllm_engram_*`` files (no live process maps them); removed only
  with ``--yes``. Never a mapped file, a symlink or anything outside /dev/shm. When some
  process's mappings cannot be read, nothing is removed without ``--force`` (exit 1).
  Processes in other PID namespaces (other containers sharing /dev/shm) are invisible
  here: a file only they map looks orphaned, so run clean inside the vLLM container.

Heavy imports stay inside the command functions (``opsctl --help`` stays cheap).
"""

from __future__ import annotations

from pathlib import Path

import typer

EXAMPLES = {"deepseek-v4.1-flash": "deepseek-v4.1-flash-engram.json"}


def _check_prefix(prefix: str) -> str:
    from opsctl.domain.engram import PREFIX
    from opsctl.errors import BadInput

    if not prefix.startswith(PREFIX) or "/" in prefix:
        raise BadInput(f"--prefix must start with {PREFIX!r} and contain no '/': {prefix!r}")
    return prefix


def register(app: typer.Typer) -> None:
    engram_app = typer.Typer(help="Shared Engram host tables in /dev/shm.", no_args_is_help=True)
    app.add_typer(engram_app, name="engram")

    @engram_app.command("inspect")
    def inspect_cmd(
        pid: list[int] = typer.Option(
            [], "--pid", help="only look at these processes' mappings (repeatable)"
        ),
        verify: str = typer.Option(
            "sample", "--verify", help="fill verification: sample | full | none"
        ),
        prefix: str = typer.Option(
            "vllm_engram_", "--prefix", help="table name prefix (narrow it to one run)"
        ),
        block_size: int | None = typer.Option(
            None,
            "--block-size",
            help="force the ue8m0 scale block (elements per scale byte); default: decided "
            "from the size, else from the data, else 32 (what vLLM 0.32 builds)",
        ),
        as_json: bool = typer.Option(False, "--json"),
        tui: bool = typer.Option(
            False, "--tui", help="show progress and results in the dashboard panel"
        ),
    ) -> None:
        """Find Engram tables (files and deleted mappings), who maps them, and verify the fill.

        Exit 1 on a fill mismatch or when verification could not complete for a table."""
        from opsctl.commands.diag.common import run_pipeline
        from opsctl.domain.engram import VERIFY_MODES
        from opsctl.errors import BadInput, CheckFailed
        from opsctl.output import emit

        if verify not in VERIFY_MODES:
            raise BadInput(f"--verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        _check_prefix(prefix)
        if block_size is not None and block_size < 1:
            raise BadInput(f"--block-size must be a positive number of elements, not {block_size}")
        pids = sorted(set(pid)) or None
        if pids:
            import psutil

            gone = [p for p in pids if not psutil.pid_exists(p)]
            if gone:
                raise BadInput(f"no such process: {', '.join(map(str, gone))}")
        report = run_pipeline(
            "engram inspect",
            lambda emit_: inspect_pipeline(emit_, pids, verify, prefix, block_size),
            tui=tui,
            as_json=as_json,
        )
        emit(report, as_json=as_json, render=lambda console: render_inspect(console, report))
        if report["exit_code"]:
            bad = [f for f in report["findings"] if f["code"] == "engram.fill_mismatch"]
            if bad:
                raise CheckFailed(
                    f"{len(bad)} Engram table(s) not constant-filled: {bad[0]['message']}"
                )
            inc = next(f for f in report["findings"] if f["code"] == "engram.verify_incomplete")
            raise CheckFailed(inc["message"])

    @engram_app.command("plan")
    def plan_cmd(
        model: Path | None = typer.Option(
            None, "--model", help="model directory with a config.json"
        ),
        config: str | None = typer.Option(
            None, "--config", help="config JSON file, or a shipped example: deepseek-v4.1-flash"
        ),
        tp: int = typer.Option(1, "--tp", help="tensor parallel size"),
        dp: int = typer.Option(1, "--dp", help="data parallel size"),
        nodes: int = typer.Option(1, "--nodes", help="nodes the DP replicas spread over"),
        shm_size: str | None = typer.Option(
            None,
            "--shm-size",
            help="/dev/shm size to plan for (e.g. 64M, 200G); default: this host's free /dev/shm",
        ),
        block_size: int | None = typer.Option(
            None,
            "--block-size",
            help="elements per ue8m0 scale byte (default: config engram_scale_block_size, "
            "else 32, what vLLM 0.32 builds)",
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Engram table bytes per rank/node for TP/DP, shared vs private, and the /dev/shm check."""
        from opsctl.output import emit

        doc = plan_document(model, config, tp, dp, nodes, shm_size, block_size)
        emit(doc, as_json=as_json, render=lambda console: render_plan(console, doc))

    @engram_app.command("clean")
    def clean_cmd(
        yes: bool = typer.Option(
            False, "--yes", help="really remove the orphans (default: only list them)"
        ),
        force: bool = typer.Option(
            False,
            "--force",
            help="with --yes: remove even though some processes' mappings or fds could not be read",
        ),
        prefix: str = typer.Option("vllm_engram_", "--prefix", help="only files with this prefix"),
        min_age: str = typer.Option(
            "60s",
            "--min-age",
            help="never remove a table changed less than this long ago (seconds, or 30s, 10m, 2h, 1d)",
        ),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """List orphaned vllm_engram_* files in /dev/shm (no live process maps them or holds
        them open, older than --min-age); --yes removes them.

        Only processes in this PID namespace can be seen: a file held only by a process in
        another container looks orphaned, so run clean where vLLM runs. If some process's
        mappings or open files cannot be read, --yes removes nothing (exit 1) unless --force
        is given. Exit 1 whenever --yes kept an orphan."""
        from opsctl import output
        from opsctl.collectors import engram as col
        from opsctl.domain.runs import parse_duration
        from opsctl.errors import BadInput, CheckFailed
        from opsctl.output import document, emit

        _check_prefix(prefix)
        if force and not yes:
            raise BadInput("--force only makes sense with --yes")
        try:
            age = parse_duration(min_age)
        except ValueError as exc:
            raise BadInput(f"--min-age: {exc}") from None
        scan = col.find_orphans(prefix, min_age=age)
        removed: list[str] = []
        kept: list[str] = []
        denied = scan.denied_pids
        if denied:
            output.warn(
                f"could not read the mappings or open files of {len(denied)} process(es) "
                f"(pids {', '.join(map(str, denied[:10]))}); files only they hold look orphaned"
            )
        if yes and scan.orphans:
            removed, kept, denied = col.remove_orphans(
                [o.name for o in scan.orphans], prefix, force=force, min_age=age
            )
        refused = bool(yes and kept and denied and not force)
        doc = document(
            "engram.clean",
            prefix=prefix,
            dry_run=not yes,
            min_age=age,
            orphans=[
                {"name": o.name, "path": o.path, "size": o.size, "mtime": o.mtime, "age": o.age}
                for o in scan.orphans
            ],
            mapped=list(scan.mapped),
            open=list(scan.open),
            young=[
                {"name": o.name, "path": o.path, "size": o.size, "mtime": o.mtime, "age": o.age}
                for o in scan.young
            ],
            ignored_symlinks=list(scan.symlinks),
            removed=removed,
            kept=kept,
            unchecked_pids=list(denied),
            forced=force,
            refused=(
                f"kept every orphan: the mappings or open files of {len(denied)} process(es) "
                "could not be read, so a file only they hold would look orphaned; run as "
                "root / inside the vLLM container, or pass --force"
                if refused
                else None
            ),
        )
        emit(doc, as_json=as_json, render=lambda console: render_clean(console, doc))
        if yes and kept:
            raise CheckFailed(
                doc["refused"]
                or f"{len(kept)} orphan(s) kept (held again, gone, or not removable): "
                f"{', '.join(kept[:5])}"
            )
        if not yes and scan.orphans:
            output.info(
                f"{len(scan.orphans)} orphan(s) listed; run again with --yes to remove them"
            )


# ---- inspect ---------------------------------------------------------------------------------

COLUMNS = ["table", "size", "split (w/s)", "linked", "mappers", "RSS / PSS each", "verify"]


def _row(t: dict) -> list[str]:
    from opsctl.output import human_bytes

    lay = t.get("layout")
    split = (
        f"{human_bytes(lay['weight_bytes'])} / {human_bytes(lay['scale_bytes'])} "
        f"(B={lay['block']}, {t.get('block_choice', {}).get('how', '?')})"
        if lay
        else "?"
    )
    ms = t["mappers"]
    each = (
        ", ".join(
            f"{m['pid']}:{human_bytes(m['rss'])}/{human_bytes(m['pss'])}"
            if m.get("rss") is not None
            else f"{m['pid']}:gone"
            for m in ms
        )
        or "-"
    )
    v = t["verify"]
    vtext = v["status"]
    if v["status"] == "mismatch":
        mm = v["first_mismatch"]
        vtext = f"MISMATCH @{mm['offset']} = {mm['value']:#04x} (want {mm['expected']:#04x})"
    elif v["status"] == "constant":
        vtext = f"constant ({v['mode']}, {v['access']})"
    elif v["status"] in ("denied", "error"):
        vtext = f"{v['status'].upper()}: {v.get('error')}"
    elif v["status"] == "unverifiable":
        vtext = f"UNVERIFIABLE: {v.get('reason')}"
    elif v.get("reason"):
        vtext = f"skipped: {v['reason']}"
    size = human_bytes(t["size"]) + ("" if t["size_source"] in ("file", "map_files") else " ~")
    return [
        t["name"],
        size,
        split,
        "yes" if t["linked"] else "deleted",
        str(len({m["pid"] for m in ms})),
        each,
        vtext,
    ]


def inspect_pipeline(
    emit, pids: list[int] | None, verify: str, prefix: str, block: int | None = None
) -> dict:
    """Collect, decide, and return the report (the same for --json, rich and --tui)."""
    from opsctl.collectors import engram as col
    from opsctl.domain import engram as dom
    from opsctl.domain.findings import verdict
    from opsctl.output import document

    emit({"phase": "scanning /dev/shm and /proc/*/maps", "columns": COLUMNS, "rows": []})

    def progress(stage: str, data: dict) -> None:
        if stage == "maps":
            emit(
                {
                    "phase": "reading smaps",
                    "events": [f"{data['mappings']} mapping(s), {data['files']} file(s)"],
                }
            )
        elif stage == "verify":
            emit(
                {
                    "phase": f"verifying ({data['mode']})",
                    "events": [f"table {data['table']} ({data['size']} bytes)"],
                }
            )

    snap = col.inspect(pids, verify, prefix, progress=progress, block=block)
    data = col.snapshot_to_dict(snap)
    import os

    findings = dom.inspect_findings(
        data["tables"], data["scan_errors"], as_root=os.geteuid() == 0, pids_given=bool(pids)
    )
    code = dom.exit_status(findings)
    result = verdict(findings)
    emit(
        {
            "phase": "done",
            "rows": [_row(t) for t in data["tables"]],
            "verdict": result,
            "summary": f"{len(data['tables'])} table(s); /dev/shm free {data['shm']['free']} of {data['shm']['total']}",
            "events": [f.message for f in findings],
        }
    )
    return document(
        "engram.inspect",
        verify=verify,
        pids=pids,
        block_size=block,
        **data,
        findings=[f.to_dict() for f in findings],
        verdict=result,
        exit_code=code,
    )


def render_inspect(console, report: dict) -> None:
    from rich.table import Table

    from opsctl.output import human_bytes

    s = report["shm"]
    t = Table(*COLUMNS, title=f"Engram tables ({report['prefix']}*)")
    for row in (_row(x) for x in report["tables"]):
        t.add_row(*row)
    console.print(t)
    console.print(
        f"/dev/shm: {human_bytes(s['total'])} total, {human_bytes(s['used'])} used, "
        f"{human_bytes(s['free'])} free"
    )
    from opsctl.output import render_findings

    render_findings(console, report["findings"], report["verdict"])


# ---- plan ------------------------------------------------------------------------------------


def _load_config(model: Path | None, config: str | None) -> tuple[dict, str]:
    import json
    from importlib import resources

    from opsctl.errors import BadInput

    if (model is None) == (config is None):
        raise BadInput(
            "give exactly one of --model DIR or --config FILE",
            hint=f"shipped examples: --config {', '.join(EXAMPLES)}",
        )
    if model is not None:
        if not model.is_dir():
            raise BadInput(f"--model {model} is not a directory")
        path = model / "config.json"
        source = str(path)
    elif config in EXAMPLES:
        ref = resources.files("opsctl") / "data" / EXAMPLES[config]
        return json.loads(ref.read_text()), f"example:{config}"
    else:
        path = Path(str(config))
        source = str(path)
    if not path.is_file():
        raise BadInput(
            f"no such config file: {path}", hint=f"shipped examples: {', '.join(EXAMPLES)}"
        )
    from opsctl.engine.model import load_json_object

    return load_json_object(path), source


def plan_document(
    model: Path | None,
    config: str | None,
    tp: int,
    dp: int,
    nodes: int,
    shm_size: str | None,
    block_size: int | None,
) -> dict:
    from opsctl.collectors import shm
    from opsctl.domain import engram_plan as ep
    from opsctl.errors import BadInput
    from opsctl.output import document

    cfg, source = _load_config(model, config)
    try:
        spec = ep.spec_from_config(cfg, block=block_size)
        if shm_size is not None:
            size = ep.parse_size(shm_size)
            free, total, shm_source = size, size, f"--shm-size {shm_size}"
        else:
            cap = shm.capacity()
            free, total, shm_source = cap.free, cap.total, "/dev/shm on this host"
        plan = ep.make_plan(
            spec, tp=tp, dp=dp, nodes=nodes, shm_free=free, shm_total=total, shm_source=shm_source
        )
    except ep.PlanError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read /dev/shm: {exc}", hint="pass --shm-size") from None
    return document("engram.plan", source=source, **plan.to_dict())


def render_plan(console, doc: dict) -> None:
    from rich.table import Table

    from opsctl.output import human_bytes

    sp = doc["spec"]
    console.print(
        f"[b]{doc['source']}[/b]: {len(sp['layer_ids'])} Engram layer(s) {sp['layer_ids']}, "
        f"{sp['total_rows']:,} rows x ({sp['head_dim']} fp8 + {sp['head_dim'] // sp['block']} ue8m0) "
        f"bytes, scale block {sp['block']} ({sp['block_source']}), "
        f"{sp['n_hash_cols']} hash heads per layer",
        highlight=False,
    )
    console.print(
        f"tables: [b]{human_bytes(doc['total_bytes'])}[/b] ({doc['total_bytes']:,} bytes) "
        f"= {', '.join(human_bytes(b) for b in doc['layer_bytes'])} per layer",
        highlight=False,
    )
    t = Table(
        "placement",
        "head shards",
        "per rank",
        "per rank (PSS)",
        "per node",
        "in /dev/shm",
        "vLLM 0.32",
        title=f"TP={doc['tp']} DP={doc['dp']} nodes={doc['nodes']} (engram DP group {doc['engram_dp']})",
    )
    for p in doc["placements"]:
        mark = "chosen" if p["name"] == doc["chosen"] else ("possible" if p["available"] else "-")
        t.add_row(
            p["name"],
            str(p["shards"]),
            human_bytes(p["per_rank_bytes"]),
            human_bytes(p["per_rank_pss_bytes"]),
            human_bytes(p["per_node_bytes"]),
            human_bytes(p["shm_bytes"]),
            mark,
        )
    console.print(t)
    fits = {True: "holds", False: "does NOT hold", None: "?"}[doc["fits_shm"]]
    console.print(
        f"{doc['shm_source']}: {human_bytes(doc['shm_free'])} free -> {fits} the "
        f"{human_bytes(doc['total_bytes'])} of tables",
        highlight=False,
    )
    console.print(f"decision: [b]{doc['chosen']}[/b]: {doc['reason']}", highlight=False)
    for note in doc["notes"]:
        console.print(f"note: {note}", highlight=False)


# ---- clean -----------------------------------------------------------------------------------


def render_clean(console, doc: dict) -> None:
    from rich.table import Table

    from opsctl.output import human_bytes

    t = Table("orphan", "size", "status", title=f"orphaned {doc['prefix']}* files in /dev/shm")
    removed = set(doc["removed"])
    kept = set(doc["kept"])
    for o in doc["orphans"]:
        status = (
            "removed"
            if o["name"] in removed
            else (
                (
                    "kept (unreadable mappings)"
                    if doc.get("refused")
                    else "kept (now held, young or gone)"
                )
                if o["name"] in kept
                else "would remove (--yes)"
            )
        )
        t.add_row(o["name"], human_bytes(o["size"]), status)
    console.print(t)
    if doc["mapped"]:
        console.print(f"in use (mapped, left alone): {', '.join(doc['mapped'])}", highlight=False)
    if doc.get("open"):
        console.print(
            f"in use (open, not mapped, left alone): {', '.join(doc['open'])}", highlight=False
        )
    if doc.get("young"):
        console.print(
            f"younger than --min-age {doc['min_age']:g} s (left alone): "
            f"{', '.join(o['name'] for o in doc['young'])}",
            highlight=False,
        )
    if doc["ignored_symlinks"]:
        console.print(
            f"symlinks (never touched): {', '.join(doc['ignored_symlinks'])}", highlight=False
        )
    if doc.get("refused"):
        console.print(f"[yellow]refused:[/] {doc['refused']}", highlight=False)
    if doc["orphans"]:
        console.print(
            "note: only processes in this PID namespace are seen; run clean where vLLM runs",
            highlight=False,
        )
