"""Rich rendering of the ``runs bundle`` document (:mod:`opsctl.checks.bundle`'s report)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import human_bytes


def render_bundle(console: Console, doc: dict[str, Any]) -> None:
    """Print the bundle's files and what is missing, then its path, size and redactions."""
    t = Table("file", "bytes", "from", title=f"bundle of run {escape(doc['run'])} ({doc['state']})")
    for f in doc["files"]:
        cut = " (last part)" if f.get("truncated") else ""
        t.add_row(escape(f["name"]), human_bytes(f["size_bytes"]) + cut, f["source"])
    for m in doc["missing"]:
        t.add_row(f"[dim]{escape(m['what'])}[/]", "-", f"[dim]{escape(m['why'])}[/]")
    console.print(t)
    console.print(
        f"{escape(doc['out'])}: {human_bytes(doc['size_bytes'])}, {doc['redactions']} secret(s) redacted"
    )
