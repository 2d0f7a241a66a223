"""The ``stacks`` document on a terminal: the verdict line, one line per process, the groups.

Renders ``opsctl.stacks/2`` (one host) and ``opsctl.stacks.merge/1`` (several hosts' reports):
the one-line verdict first (the stuck rank, the frame the others wait in), then each
process's line, then identical stacks grouped across processes (and hosts)."""

from __future__ import annotations

MAX_MEMBERS = 6
MAX_FRAMES = 12


def _header(doc: dict) -> str:
    if "reports" in doc:
        files = ", ".join(f"{r['host']} ({r['file']})" for r in doc["reports"])
        return f"[b]stacks[/] of {len(doc['reports'])} hosts: {files}"
    return (
        f"[b]stacks[/] of pid {doc['pid']} on {doc.get('host')} "
        f"({len(doc['processes'])} processes, two takes {doc.get('interval')} s apart, "
        f"{doc['seconds']} s)"
    )


def render(con, doc: dict) -> None:
    """Print the stacks document: a header, the verdict, each process's line, each group."""
    from rich.markup import escape

    hosts = "reports" in doc
    con.print(_header(doc))
    colour = "green" if doc["verdict"] == "pass" else "red"
    con.print(f"[{colour}][b]{doc['verdict']}[/b][/]: {escape(doc['headline'])}", soft_wrap=True)
    for p in doc["processes"]:
        where = f"{p.get('host')}/" if hosts else ""
        con.print("  " + escape(where + p["verdict"]), soft_wrap=True)
    for g in doc["groups"]:
        who = ", ".join(
            (f"{m.get('host')}/" if hosts else "") + f"{m['role']} {m['pid']}"
            for m in g["members"][:MAX_MEMBERS]
        )
        more = f" (+{len(g['members']) - MAX_MEMBERS})" if len(g["members"]) > MAX_MEMBERS else ""
        con.print(f"[b]{len(g['members'])} thread(s)[/]: {escape(who)}{more}")
        for f in g["frames"][:MAX_FRAMES]:
            path = f["file"].split("site-packages/")[-1]
            con.print(f"    {escape(f['func'])} ({escape(path)}:{f['line']})", soft_wrap=True)
