"""The rich (terminal) view of a ``diag.kv-fail`` document, for `opsctl diag kv-fail`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from opsctl.output import render_findings
from opsctl.suite.kv_fail.judge_report import SEED_COLUMNS, seed_table
from opsctl.suite.kv_fail.run import COLUMNS


def _groups(doc: Mapping[str, Any]) -> str:
    groups = doc.get("kv_cache_groups") or []
    named = ", ".join(
        f"{g.get('spec')}" + (f"(window {g['sliding_window']})" if g.get("sliding_window") else "")
        for g in groups
    )
    return f"{len(groups)} KV cache group(s): {named}"


def _cell(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "-"
    return (
        "identical" if c["identical"] else f"differs (max |dlogprob| {c.get('max_logprob_diff')})"
    )


def _requests(doc: Mapping[str, Any]) -> Table:
    table = Table(*COLUMNS)
    for r in doc.get("requests", []):
        outcome = "failed" if r["failed"] else (r.get("finish_reason") or "-")
        table.add_row(
            str(r["index"]),
            str(r["prompt_tokens"]),
            "yes" if r["targeted"] else "no",
            _cell(r.get("roundtrip")),
            str(r["injected_blocks"]),
            outcome,
            "n/a" if r["failed"] else _cell(r.get("inject")),
            _cell(r.get("sensitivity")),
        )
    return table


def noise_text(noise: Mapping[str, Any] | None) -> str | None:
    """The comparison's noise floor as one line, or None.

    None: no round trip was compared, or a document recorded before the field existed.
    """
    if not noise or noise.get("mode") is None:
        return None
    floor, mode = noise.get("max_logprob_diff"), noise["mode"]
    if mode == "bitwise":
        return "noise floor 0 (store/reload bitwise equal): compared bitwise"
    sens = noise.get("min_sensitivity_max_logprob_diff")
    head = f"noise floor {floor:.3g} (store/reload not bitwise"
    head += ", tokens equal)" if noise.get("roundtrip_tokens_equal") else ", tokens DIFFER)"
    ratio = noise.get("separation")
    times = "" if ratio is None else f" ({ratio:.0f}x)"
    if mode == "noise_floor":
        return (
            f"{head}: compared within {noise.get('tolerance'):.3g}, corrupted blocks "
            f"{sens:.3g}{times}"
        )
    need = noise.get("separation_needed")
    against = "no sensitivity figures" if sens is None else f"corrupted blocks {sens:.3g}{times}"
    if need and sens is not None:
        against += f", {need}x needed"
    return f"{head}: [red]comparison inconclusive[/] ({against})"


def platform_text(doc: Mapping[str, Any]) -> str:
    """The platform for a human line: the name, else "unknown (<platform_note>)", else "-"."""
    note = doc.get("platform_note")
    return doc.get("platform") or (f"unknown ({note})" if note else "-")


def patches_text(doc: Mapping[str, Any]) -> str:
    """The recovery patches' states as one phrase.

    The recovery patches' states ("patches kv_hybrid_recompute applied, ..."); a
    document from before they were listed names its one patch.
    """
    rows = doc.get("recovery_patches") or [doc.get("patch") or {}]
    states = ", ".join(f"{p.get('name')} {p.get('status') or '-'}" for p in rows)
    return f"patch{'es' if len(rows) > 1 else ''} {states}"


def _seeds(con: Console, doc: Mapping[str, Any]) -> None:
    """A sweep's per-seed rows and totals (nothing for one seed)."""
    seeds = doc.get("seeds") or []
    if len(seeds) < 2:
        return
    table = Table(*SEED_COLUMNS, title="seeds")
    for row in seed_table(seeds):
        table.add_row(*row)
    con.print(table)
    t = doc.get("totals") or {}
    con.print(
        f"{t.get('seeds')} seeds: {t.get('pass')} pass, {t.get('fail')} fail, "
        f"{t.get('inconclusive')} inconclusive; {t.get('engine_starts')} engine start(s); "
        f"below: seed {doc.get('verdict_seed')}, the one the verdict stands on"
    )


def render(con: Console, doc: Mapping[str, Any]) -> None:
    """Print the kv-fail document: settings, a sweep's seeds, requests, noise floor, findings."""
    con.print(
        f"[b]diag kv-fail[/] {doc.get('model')} on vLLM {doc.get('vllm_version') or '?'}, "
        f"platform {escape(platform_text(doc))}, {_groups(doc)}"
    )
    inj = doc.get("injection") or {}
    what = inj.get("rate") if inj.get("mode") == "rate" else inj.get("blocks")
    con.print(
        f"policy {doc.get('kv_load_failure_policy')}; {patches_text(doc)}; "
        f"injection {inj.get('mode')} {what} "
        f"seed {inj.get('seed')} on requests {inj.get('targets')}, "
        f"reported as failed {inj.get('route') or 'blocks'}"
    )
    _seeds(con, doc)
    con.print(_requests(doc))
    con.print(
        f"failures injected {doc['failures_injected']}, requests affected "
        f"{doc['requests_affected']}, tokens recomputed {doc['tokens_recomputed']} (engine), "
        f"requests failed {doc['requests_failed']}, "
        f"engine alive {'yes' if doc['engine_alive'] else '[red]NO[/]'}, "
        f"outputs identical {'yes' if doc['outputs_identical'] else 'no'}"
    )
    if line := noise_text(doc.get("noise_floor")):
        con.print(line)
    render_findings(
        con,
        list(doc.get("findings", [])),
        doc["verdict"],
        f"  ({doc.get('duration_s')} s, run {doc.get('run_dir')})",
    )
