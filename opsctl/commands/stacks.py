"""`opsctl stacks TARGET`: where every process of a local vLLM server waits.

Python stacks, taken without stopping the engine. Thin: options -> opsctl.checks.stacks
-> emit."""

from __future__ import annotations

import typer

from opsctl.commands.options import command, duration_option, json_option
from opsctl.errors import CheckFailed


def register(app: typer.Typer) -> None:
    """Add ``opsctl stacks`` to ``app``."""

    @command(
        app,
        "stacks",
        "Where each process of a local vLLM server is stuck (stacks).",
        "opsctl stacks 127.0.0.1:8000",
        "opsctl stacks 20261204-151850-kv-fail-tiny-llama-32019 --json",
        "opsctl stacks 4242 --native",
    )
    def stacks(
        target: str = typer.Argument(
            ..., metavar="URL|RUN|PID", help="a local server's URL, an opsctl run, or a pid"
        ),
        as_json: bool = json_option(),
        native: bool = typer.Option(
            False,
            "--native",
            help=(
                "C frames too, through py-spy (a CUDA sync, a collective, a lock); "
                "py-spy pauses each process for that read"
            ),
        ),
        timeout: float = duration_option("5s", "--timeout", help="the longest wait for the dumps"),
    ) -> None:
        """The Python stacks of every process of a local vLLM server, labelled by role,
        identical ones grouped, one line per process naming where it waits."""
        from opsctl.checks import stacks as check
        from opsctl.output import emit

        report = check.run(target, check.Options(timeout=timeout, native=native))
        doc = report.to_dict()
        emit(doc, as_json=as_json, render=lambda con: render(con, doc))
        if report.verdict != "pass":
            raise CheckFailed(
                "no stack could be read: " + "; ".join(p["verdict"] for p in doc["processes"])[:600]
            )


def render(con, doc: dict) -> None:
    """Print the stacks document: a header, each process's line, each group's frames."""
    from rich.markup import escape

    con.print(
        f"[b]stacks[/] of pid {doc['pid']} ({len(doc['processes'])} processes, {doc['seconds']} s)"
    )
    for p in doc["processes"]:
        con.print("  " + escape(p["verdict"]), soft_wrap=True)
    for g in doc["groups"]:
        who = ", ".join(f"{m['role']} {m['pid']}" for m in g["members"][:6])
        more = f" (+{len(g['members']) - 6})" if len(g["members"]) > 6 else ""
        con.print(f"[b]{len(g['members'])} thread(s)[/]: {escape(who)}{more}")
        for f in g["frames"][:12]:
            path = f["file"].split("site-packages/")[-1]
            con.print(f"    {escape(f['func'])} ({escape(path)}:{f['line']})", soft_wrap=True)
