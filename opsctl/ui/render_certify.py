"""The human summary of ``opsctl certify`` (stdout): one table row per check (check,
verdict, time, first finding), the engine starts and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from opsctl.domain import certify as dom

COLOURS = {"PASS": "green", "UNVERIFIED": "yellow", "FAIL": "red", "ERROR": "red"}


def render(doc: dict[str, Any]) -> Callable[[Console], None]:
    def draw(console: Console) -> None:
        from rich.markup import escape
        from rich.table import Table

        table = Table(*dom.SUMMARY_COLUMNS, title=dom.title_of(doc))
        for check, verdict, seconds, first in dom.summary_rows(doc["checks"]):
            colour = COLOURS.get(verdict, "dim")
            table.add_row(check, f"[{colour}]{verdict}[/]", seconds, escape(first))
        console.print(table)
        for e in doc["engines"]:
            console.print(
                f"engine {e['index']}: {e['model']} healthy after {e['healthy_after_s']:.1f} s, "
                f"served {', '.join(e['served'])}",
                highlight=False,
                markup=False,
            )
        s = doc["summary"]
        colour = "green" if doc["verdict"] == "pass" else "red"
        console.print(
            f"verdict: [b {colour}]{doc['verdict'].upper()}[/]  {s['run']} run, "
            f"{s['skipped']} skipped, {s['engine_starts']} engine start(s), {doc['duration_s']:.0f} s",
            highlight=False,
        )

    return draw
