"""Rich tables for `opsctl diag invariance` (a terminal without ``--json``).

The modes side by side, then per mode its isolating settings, its prompts and its warnings. Reads
only the report's JSON document (``opsctl.diag.invariance/3``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.suite.invariance import judge as inv

VERDICT = {
    "pass": "[green]PASS[/]",
    "fail": "[red]FAIL[/]",
    "inconclusive": "[yellow]INCONCLUSIVE[/]",
}
SETTING_STYLE = {"verified": "green", "mismatch": "red", "not verified": "yellow"}


def _batch_text(run: dict) -> str:
    b = run["batch"]
    again = f", attempt {b['attempts']}" if (b.get("attempts") or 1) > 1 else ""
    if b.get("tokens") is not None:  # counters give a lower bound on the peak
        return f">= {b['max_batch']} together ({b['tokens']} tokens in {b['steps']} steps{again})"
    return f"{b['max_batch']} together ({b['source']}{again})"


def _divergence(p: dict[str, Any]) -> str:
    d = p["first_divergence"]
    result = inv.PromptResult(
        p["index"], p["status"], p["reason"], inv.Divergence(**d) if d else None
    )
    return inv.divergence_text(result)


def _images_text(run: dict) -> str:
    im = run.get("images") or {}
    if not im.get("max_per_prompt"):
        return "none (text only)"
    return f"{im['total']} ({'/'.join(map(str, im['per_prompt']))} per prompt)"


def _reached_text(run: dict) -> str:
    im = run.get("images") or {}
    if not im.get("max_per_prompt"):
        return "-"
    if not im.get("reached"):
        missing = im.get("missing") or ["not shown"]
        return f"[red]NO[/]: {escape(missing[0])}" + (
            f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        )
    got = " / ".join(
        f"{side} {sum(v or 0 for v in im['received'].get(side, []))}" for side in ("BS=1", "BS=N")
    )
    text = f"yes: engine core got {got}" if im.get("received") else "yes"
    if im.get("encoded"):
        text += f"; encoder batch up to {im.get('encoder_max_batch')} prompts"
    if not im.get("received"):
        text += f" ({im.get('source')})"
    return text


def platform_text(doc: dict) -> str:
    """A document's (or run's) platform for a human line.

    The name, else "unknown (<platform_note>)", else "-".
    """
    note = doc.get("platform_note")
    return doc.get("platform") or (f"unknown ({note})" if note else "-")


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def header(doc: dict) -> str:
    """The first line: what ran where (the platform vLLM reported and its version)."""
    models = ", ".join(dict.fromkeys(str(r["model"]) for r in doc["runs"] if r.get("model")))
    return (
        f"[b]diag invariance[/] {escape(models or '?')} on vLLM {doc.get('vllm_version') or '?'}, "
        f"platform {escape(platform_text(doc))}"
    )


def _modes_table(doc: dict) -> Table:
    runs = doc["runs"]
    head = Table(
        title=f"batch invariance: BS=1 vs BS={doc['batch_size']} ({doc['comparison']}, "
        f"{doc['prompts']} prompts x {doc['max_tokens']} tokens, top-{doc['logprobs']})"
    )
    head.add_column("")
    for r in runs:
        head.add_column(str(r["mode"]))

    def row(name: str, fn) -> None:
        head.add_row(name, *[str(fn(r)) for r in runs])

    row("verdict", lambda r: VERDICT.get(r["verdict"], r["verdict"]))
    row("tokens identical", lambda r: r["summary"]["tokens_identical"])
    row(
        "identical / within atol / diverged / error",
        lambda r: "{identical} / {within_atol} / {diverged} / {errors}".format(**r["summary"]),
    )
    row("largest |Δ logprob|", lambda r: inv.fmt_diff(r["summary"]["largest_diff"]))
    row("batch formed", _batch_text)
    row("images sent", _images_text)
    row("images reached the engine", _reached_text)
    row(
        "execution",
        lambda r: ", ".join(f"{k}={v}" for k, v in (r["execution"] or {}).items()) or "?",
    )
    row("platform", lambda r: r.get("platform") or "-")
    row("vLLM", lambda r: r["vllm_version"] or "?")
    row(
        "seconds engine / BS=1 / BS=N",
        lambda r: " / ".join(_num(r["durations_s"].get(k)) for k in ("engine", "bs1", "bsn")),
    )
    return head


def _settings_table(run: dict) -> Table:
    st = Table(title=f"{run['mode']}: isolating settings")
    for c in ("setting", "wanted", "seen", "status", "source"):
        st.add_column(c)
    for s in run["settings"]:
        style = SETTING_STYLE.get(s["status"], "")
        status = f"[{style}]{s['status']}[/]" if style else s["status"]
        st.add_row(s["name"], s["wanted"], s["seen"], status, s["source"])
    return st


def _prompts_table(run: dict) -> Table:
    pt = Table(title=f"{run['mode']}: per prompt")
    for c in (
        "#",
        "prompt",
        "images",
        "status",
        "first divergence (pos, tokens, logprobs alone/batched, Δ)",
        "largest |Δ|",
    ):
        pt.add_column(c)
    for p in run["prompts"]:
        pt.add_row(
            str(p["index"]),
            escape(inv.preview(p["prompt"])),
            str(p.get("images", 0)),
            p["status"],
            escape(_divergence(p)),
            inv.fmt_diff(p["largest_diff"]),
        )
    return pt


def render(con: Console, doc: dict) -> None:
    """Print the invariance document: header, modes, each run's settings, prompts, warnings."""
    con.print(header(doc))
    con.print(_modes_table(doc))
    sweep = bool(doc.get("seeds"))
    for r in doc["runs"]:
        if not sweep or r["verdict"] != "pass":  # a sweep details only its seeds not passed
            con.print(_settings_table(r))
            con.print(_prompts_table(r))
        con.print(calibration_line(r))
        for w in r["warnings"]:
            con.print(f"[yellow]warning:[/] {escape(w)}")
    for line in doc.get("reasons") or []:
        if "inconclusive" in line:
            con.print(f"[yellow]reason:[/] {escape(line)}")
    if sweep:
        t = doc["totals"]
        con.print(
            f"sweep over {len(doc['seeds'])} seeds: {t['pass']} pass, {t['fail']} fail, "
            f"{t['inconclusive']} inconclusive"
        )
    verdict = VERDICT.get(doc["verdict"], doc["verdict"])
    con.print(f"verdict: {verdict}  ({_num(doc.get('duration_s'))} s)")


def calibration_line(run: dict) -> str:
    """One run's calibration: seed, floor, sensitivity, bound and whether it is conclusive."""
    c = run.get("calibration")
    if not c:
        return f"{run['mode']}: no calibration (the run did not reach its comparison)"
    seed = f" seed {run['seed']}" if run.get("seed") is not None else ""
    floor = "tokens differ" if c["floor_tokens_differ"] else inv.fmt_diff(c["floor"])
    sens = "tokens differ" if c.get("sensitivity_tokens_differ") else inv.fmt_diff(c["sensitivity"])
    rule = "bitwise" if c["bitwise"] else f"bound {inv.fmt_diff(c['bound'])}"
    state = "conclusive" if c["conclusive"] else "[yellow]NOT conclusive[/]"
    verdict = VERDICT.get(run["verdict"], run["verdict"])
    return (
        f"{run['mode']}{seed}: {verdict}  noise floor {floor} (BS=1 twice), sensitivity {sens} "
        f"(planted), {rule}: {state}"
    )
