"""Rich rendering of the ``runs bundle`` document (:mod:`opsctl.checks.bundle`'s report)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import human_bytes


def render_bundle(console: Console, doc: dict[str, Any]) -> None:
    """Print the bundle's files, what is missing, the first rank death, path and size.

    Then the redactions; the first rank death only when one died."""
    t = Table("file", "bytes", "from", title=f"bundle of run {escape(doc['run'])} ({doc['state']})")
    for f in doc["files"]:
        cut = " (last part)" if f.get("truncated") else ""
        t.add_row(escape(f["name"]), human_bytes(f["size_bytes"]) + cut, f["source"])
    for m in doc["missing"]:
        t.add_row(f"[dim]{escape(m['what'])}[/]", "-", f"[dim]{escape(m['why'])}[/]")
    console.print(t)
    if doc.get("first_death"):
        console.print(f"[b red]first rank death:[/] {escape(doc['first_death'])}")
    console.print(
        f"{escape(doc['out'])}: {human_bytes(doc['size_bytes'])}, {doc['redactions']} secret(s) redacted"
    )
