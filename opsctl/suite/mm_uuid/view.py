"""Rich tables for `opsctl diag mm-uuid` (a terminal without ``--json``).

The identifier each image reached the engine core with, the reused-UUID requests, the findings.
Reads only the report's JSON document (``opsctl.diag.mm_uuid/2``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import render_findings
from opsctl.suite.mm_uuid.judge import Observation
from opsctl.suite.mm_uuid.run import TABLE_COLUMNS, reuse_rows, table_rows


def platform_text(doc: dict[str, Any]) -> str:
    """The platform for a human line: the name, else "unknown (<platform_note>)", else "-"."""
    note = doc.get("platform_note")
    return doc.get("platform") or (f"unknown ({note})" if note else "-")


def observation(d: dict[str, Any]) -> Observation:
    """An observation of the report's ``observations`` list as the domain's record."""
    return Observation(**{k: d[k] for k in Observation.__slots__})  # type: ignore[attr-defined]


def render(console: Console, doc: dict[str, Any]) -> None:
    """Draw the report (its JSON document) on ``console``."""
    console.print(
        f"[b]diag mm-uuid[/] on vLLM {doc.get('vllm_version') or '?'}, "
        f"platform {escape(platform_text(doc))}"
    )
    t = Table(*TABLE_COLUMNS, title="identifier each image reached the engine core with")
    for cells in table_rows([observation(d) for d in doc["items"]]):
        v = cells[-1]
        cells = [escape(c) for c in cells]
        cells[-1] = f"[green]{v}[/]" if v == "PASS" else f"[red]{v}[/]"
        t.add_row(*cells)
    console.print(t)
    if doc["reuse"]:
        r = Table(*TABLE_COLUMNS[:-1], "output", title="one UUID reused for a different image")
        for cells in reuse_rows([observation(d) for d in doc["reuse"]]):
            r.add_row(*[escape(c) for c in cells])
        console.print(r)
    render_findings(console, doc["findings"], doc["verdict"])
