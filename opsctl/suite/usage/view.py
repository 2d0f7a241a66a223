"""Rich tables for `opsctl diag usage` (a terminal without ``--json``).

One table per endpoint, then the findings. Reads only the report's JSON document
(``opsctl.diag.usage/2``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import render_findings
from opsctl.suite.usage.judge import UsageRow
from opsctl.suite.usage.run import TABLE_COLUMNS, table_rows

COLOURS = {"PASS": "green", "UNVERIFIED": "yellow"}  # anything else (FAIL) is red


def platform_text(doc: dict[str, Any]) -> str:
    """The platform for a human line: the name, else "unknown (<platform_note>)", else "-"."""
    note = doc.get("platform_note")
    return doc.get("platform") or (f"unknown ({note})" if note else "-")


def render(console: Console, doc: dict[str, Any]) -> None:
    """Draw the report (its JSON document) on ``console``."""
    console.print(
        f"[b]diag usage[/] {escape(str(doc['model']))} on vLLM "
        f"{doc.get('vllm_version') or '?'}, platform {escape(platform_text(doc))}"
    )
    rows = [UsageRow.from_dict(r) for r in doc["rows"]]
    for endpoint in dict.fromkeys(r.endpoint for r in rows):
        t = Table(*TABLE_COLUMNS[2:], title=f"{endpoint} on {doc['kind']} ({doc['model']})")
        for r, cells in zip(rows, table_rows(rows), strict=True):
            if r.endpoint == endpoint:
                v = cells[5]
                cells = [escape(c) for c in cells]
                cells[5] = f"[{COLOURS.get(v, 'red')}]{v}[/]"
                t.add_row(*cells[2:])
        console.print(t)
    render_findings(console, doc["findings"], doc["verdict"])
