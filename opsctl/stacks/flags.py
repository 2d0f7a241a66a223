"""`opsctl stacks TARGET`: where each process of a local vLLM server waits, which rank is stuck.

`opsctl stacks --merge A.json B.json`: one verdict over several hosts' reports. Thin: options -> opsctl.stacks.run -> emit (opsctl.stacks.view)."""

from __future__ import annotations

import typer

from opsctl.commands.options import command, duration_option, json_option
from opsctl.errors import BadInput, CheckFailed


def register(app: typer.Typer) -> None:
    """Add ``opsctl stacks`` to ``app``."""

    @command(
        app,
        "stacks",
        "Where each process of a local vLLM server is stuck, and which rank (stacks).",
        "opsctl stacks 127.0.0.1:8000",
        "opsctl stacks 20261204-151850-kv-fail-tiny-llama-32019 --json",
        "opsctl stacks 4242 --native",
        "opsctl stacks 127.0.0.1:8000 --json --host node-a > node-a.json",
        "opsctl stacks --merge node-a.json node-b.json",
    )
    def stacks(
        targets: list[str] = typer.Argument(
            ...,
            metavar="URL|RUN|PID",
            help="a local server's URL, an opsctl run, or a pid (with --merge: report files)",
        ),
        merge: bool = typer.Option(
            False,
            "--merge",
            help=(
                "the arguments are `opsctl stacks --json` reports of the hosts of one server: "
                "one verdict over all their ranks (keyed by host and role)"
            ),
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
        interval: float = duration_option(
            "1s",
            "--interval",
            help="time between the two takes (a stuck rank stays put, a working one moves)",
        ),
        host: str = typer.Option(
            None,
            "--host",
            metavar="NAME",
            help="this host's name in the report (default: the machine's host name)",
        ),
    ) -> None:
        """The Python stacks of every process of a local vLLM server, labelled by rank,
        taken twice; one line naming the stuck rank and the frame the others wait in."""
        from opsctl.output import emit
        from opsctl.stacks import run as check
        from opsctl.stacks.view import render

        if merge:
            report = check.merge(targets)
        elif len(targets) != 1:
            raise BadInput("give one URL|RUN|PID (reports of several hosts: --merge FILE FILE...)")
        else:
            options = check.Options(timeout=timeout, native=native, interval=interval, host=host)
            report = check.run(targets[0], options)
        doc = report.to_dict()
        emit(doc, as_json=as_json, render=lambda con: render(con, doc))
        if report.verdict != "pass":
            raise CheckFailed(f"{report.verdict}: {doc['headline']}"[:600])
