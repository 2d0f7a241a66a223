"""The human summary of ``opsctl certify`` (stdout), for one target or a fleet.

One table row per check (check, verdict, time, first finding), the engine starts and the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console

from opsctl.checks import certify as checks
from opsctl.domain import certify as certify_dom


def title_of(doc: Mapping[str, Any]) -> str:
    """ "certify MODEL (URL)": the run's name in the summary and the JUnit suite."""
    where = (doc.get("target") or {}).get("url") or "engine started by opsctl"
    model = certify_dom.model_of(doc)
    return f"certify {model} ({where})" if model else f"certify {where}"


COLOURS = {
    "PASS": "green",
    "UNVERIFIED": "yellow",
    "INCONCLUSIVE": "yellow",
    "FAIL": "red",
    "ERROR": "red",
}


def render(doc: dict[str, Any]) -> Callable[[Console], None]:
    """The summary drawer of a certify document: the checks table, engines and verdict line."""

    def draw(console: Console) -> None:
        from rich.markup import escape
        from rich.table import Table

        table = Table(*checks.SUMMARY_COLUMNS, title=title_of(doc))
        for check, verdict, seconds, first in checks.summary_rows(doc["checks"]):
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
        _verdict(console, doc, f"{s['run']} run, {s['skipped']} skipped, "
                 f"{s['engine_starts']} engine start(s)")  # fmt: skip

    return draw


def render_fleet(doc: dict[str, Any]) -> Callable[[Console], None]:
    """A fleet: one row per target (name, URL, verdict, state, time, first failure)."""
    from opsctl.checks import certify_fleet as fleet

    def draw(console: Console) -> None:
        from rich.markup import escape
        from rich.table import Table

        table = Table(*fleet.FLEET_COLUMNS, title=f"certify: {len(doc['targets'])} target(s)")
        for name, url, verdict, state, seconds, first in fleet.summary_rows(doc["targets"]):
            colour = COLOURS.get(verdict, "dim")
            table.add_row(escape(name), url, f"[{colour}]{verdict}[/]", state, seconds,
                          escape(first))  # fmt: skip
        console.print(table)
        s = doc["summary"]
        _verdict(console, doc, f"{s['passed']} of {s['targets']} target(s) passed")

    return draw


def _verdict(console: Console, doc: dict[str, Any], counts: str) -> None:
    colour = "green" if doc["verdict"] == "pass" else "red"
    console.print(
        f"verdict: [b {colour}]{doc['verdict'].upper()}[/]  {counts}, {doc['duration_s']:.0f} s",
        highlight=False,
    )
