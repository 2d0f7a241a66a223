"""Rich tables for `opsctl diag lora` (a terminal without ``--json``).

LoRA support per part, then the cases. Reads only the report's JSON document
(``opsctl.diag.lora/3``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

VERDICT = {
    "pass": "[green]PASS[/]",
    "fail": "[red]FAIL[/]",
    "unverified": "[yellow]UNVERIFIED[/]",
    "inconclusive": "[yellow]INCONCLUSIVE[/]",
}
STATUS = {"applied": "green", "supported": "green", "unsupported": "red", "not enabled": "yellow"}


def render(con: Console, doc: dict[str, Any]) -> None:
    """Draw the report (its JSON document) on ``con``."""
    engine = doc["engine"] or {}
    con.print(
        f"diag lora: {VERDICT.get(doc['verdict'], doc['verdict'])}  model {doc['model']}  "
        f"platform {doc['platform'] or 'unknown (' + str(doc.get('platform_note')) + ')'}  vLLM {doc['vllm_version'] or '?'}  "
        f"compilation {engine.get('compilation_mode', '?')}  ({doc['comparison']})"
    )
    parts = Table(title="LoRA support per part (engine record + measurement)")
    for col in ("part", "status", "wrapped", "why"):
        parts.add_column(col)
    for p in doc["support"]:
        style = STATUS.get(p["status"], "yellow")
        wrapped = "?" if p["wrapped_modules"] is None else str(p["wrapped_modules"])
        parts.add_row(p["part"], f"[{style}]{p['status']}[/]", wrapped, escape(p["detail"]))
    con.print(parts)
    cases = Table(title="cases")
    for col in ("case", "adapter", "verdict", "detail"):
        cases.add_column(col)
    for s in doc["single"]:
        cases.add_row("single", s["adapter"], VERDICT.get(s["verdict"]), escape(s["detail"]))
    mixed, batch = doc["mixed"], doc["mixed"]["batch"]
    first = mixed["first_divergence"]
    detail = (
        f"first divergence r{first['request']} ({first['adapter']}, images "
        f"{'+'.join(first['images']) or '-'}): {first['text']}"
        if first
        else f"{len(mixed['requests'])} requests equal their alone runs"
    )
    detail += f"; batch: {batch['max_adapters_per_step']} adapters/step ({batch['source']})"
    if enc := mixed["encoder"]:
        detail += f"; vision encoder: {enc['max_adapters_per_step']} adapters/call"
    if first and first.get("looks_like"):
        detail += f"; r{first['request']} got {first['looks_like']}'s output"
    cases.add_row("mixed", "all", VERDICT.get(mixed["verdict"]), escape(detail))
    con.print(cases)
    for s in doc.get("sweep") or []:
        seed = "" if s["seed"] is None else f"seed {s['seed']}: "
        floor = "tokens differ" if s["floor"] is None else f"{s['floor']:.3g}"
        sens = "tokens differ" if s["sensitivity"] is None else f"{s['sensitivity']:.3g}"
        state = "conclusive" if s["conclusive"] else "[yellow]NOT conclusive[/]"
        con.print(
            f"{seed}{VERDICT.get(s['verdict'], s['verdict'])}  noise floor {floor} (base twice), "
            f"sensitivity {sens} (adapter vs adapter): {state}"
        )
    for line in doc["reasons"]:
        con.print(f"[red]reason:[/] {escape(line)}")
