"""Rich output of the upgrade preflight (`opsctl patches --against VERSION|WHEEL`).

One table (per patch and probe: exists / unchanged / upstream / changed around / verdict), then per
patch what needs a look (missing or changed targets with a diff excerpt, changed watched code, the
members changed around it). Reads only the report's JSON document (``opsctl.preflight/1``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

COLOURS = {
    "unchanged": "green",
    "upstream": "cyan",
    "review": "yellow",
    "changed": "yellow",
    "unknown": "yellow",
    "missing": "red",
}
ROUTE_COLOURS = {"safe": "green", "safe with opsctl": "cyan", "absent": "dim", "unsafe": "red"}
VERDICT_COLOURS = {"pass": "green", "unverified": "yellow", "fail": "red"}
EXCERPT = 12


def _yn(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _symbols(console: Console, title: str, findings: list[dict]) -> None:
    for t in findings:
        if t["unchanged"] is True:
            continue
        if not t["exists"]:
            state = "missing"
        elif t.get("verified_exists") is False:
            state = "new (absent on the verified release)"
        else:
            state = "changed" if t["unchanged"] is False else "not recorded"
        console.print(f"  {title} [b]{escape(t['symbol'])}[/]: {state}")
        diff = t.get("diff")
        if diff:
            console.print(f"    +{diff['added_lines']} -{diff['removed_lines']} lines", style="dim")
            for line in diff["excerpt"][:EXCERPT]:
                console.print("    " + escape(line), style="dim", soft_wrap=True)


def _attributes(console: Console, attributes: list[dict]) -> None:
    """Declared attributes this release lost, or has under another of their names."""
    for a in attributes:
        first = a["attribute"].rsplit(".", 1)[1].split("|")[0]
        where = escape(a["attribute"].split(":", 1)[1].split("|")[0])
        if a["found"] is None:
            state = "class gone" if not a["class_exists"] else "gone: nothing reads what it writes"
            console.print(f"  attribute [b]{where}[/]: [red]{state}[/]")
        elif a["found"] != first:
            console.print(f"  attribute [b]{where}[/]: gone; uses {escape(a['found'])} instead")


def render(console: Console, doc: dict[str, Any]) -> None:
    """Print the preflight document: the patches table, then what needs a look per patch."""
    source = doc.get("source") or {}
    console.print(
        f"[b]patches --against[/] vLLM {escape(str(doc.get('vllm_version') or '?'))} "
        f"({escape(str(source.get('kind')))}: {escape(str(source.get('path')))}), "
        f"verified on {', '.join(doc.get('verified_releases') or []) or 'nothing recorded'}"
    )
    table = Table("patch", "kind", "exists", "unchanged", "upstream", "changed around", "verdict")
    for p in doc["patches"]:
        v = p["verdict"]
        table.add_row(
            escape(p["name"]),
            p["kind"],
            _yn(p["exists"]),
            _yn(p["unchanged"]),
            "n/a" if p["upstream_why"] is None else _yn(p["upstream"]),
            str(p["changed_around_count"]),
            f"[{COLOURS.get(v, 'red')}]{v}[/]",
        )
    console.print(table)
    for p in doc["patches"]:
        if p["verdict"] == "unchanged":
            continue
        note = f" ({escape(p['note'])})" if p.get("note") else ""
        console.print(f"[b]{escape(p['name'])}[/]: {p['verdict']}{note}")
        if p["upstream_why"]:
            console.print(f"  upstream rule: {escape(p['upstream_why'])}")
        for r in p.get("replaced") or ():
            console.print(
                f"  target {escape(r['target'])}: gone; uses {escape(r['instead'])} instead",
                soft_wrap=True,
            )
        _symbols(console, "target", p["targets"])
        _symbols(console, "relies on", p["watched"])
        _attributes(console, p.get("attributes") or [])
        for scope, names in p["changed_around"].items():
            more = p["changed_around_count"] if len(p["changed_around"]) == 1 else None
            tail = f" (of {more})" if more and more > len(names) else ""
            console.print(
                f"  around {escape(scope)}{tail}: {escape(', '.join(names))}", soft_wrap=True
            )
    routes = doc.get("kv_failure_routes") or []
    if routes:
        console.print(
            f"[b]KV load failures on vLLM {escape(str(doc.get('vllm_version') or '?'))}[/]"
        )
    for r in routes:
        colour = ROUTE_COLOURS.get(r["status"], "yellow")
        console.print(
            f"  {escape(r['route'])}: [{colour}]{r['status']}[/]: {escape(r['advice'])}",
            soft_wrap=True,
        )
    colour = VERDICT_COLOURS.get(doc["verdict"], "red")
    console.print(f"verdict: [{colour}]{doc['verdict']}[/]")
