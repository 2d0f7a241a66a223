"""The pipeline behind `opsctl diag invariance`: per mode, get a target (a URL or an
engine started with the isolating settings), run BS=1 and BS=N, compare, read the
engine's own records back, and build the report. Also the rich rendering of it.

The same ``run_all(req, emit)`` feeds the plain CLI, ``--json`` and the ``--tui`` panel.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.domain import invariance as inv

Emit = Callable[[dict], None]
COLUMNS = ["mode", "#", "prompt", "status", "first divergence", "largest |Δ|"]


@dataclass(frozen=True)
class Request:
    url: str | None
    model: str | None
    prompts: list[str]
    batch_size: int
    max_tokens: int
    logprobs: int
    atol: float | None
    modes: list[str | None]
    timeout: float
    tag: str
    batch_via: str = "list"  # list: one request with N prompts | requests: N concurrent requests
    api_key: str | None = None  # bearer token for a URL target
    knobs: dict[str, str] | None = None  # test knobs for engines opsctl starts (--test-knob)


def _batch_text(run: dict) -> str:
    b = run["batch"]
    if b.get("tokens") is not None:  # counters give a lower bound on the peak
        return f">= {b['max_batch']} together ({b['tokens']} tokens in {b['steps']} steps)"
    return f"{b['max_batch']} together ({b['source']})"


def _preview(text: str, n: int = 28) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _fmt_diff(d: float | None) -> str:
    return "-" if d is None else ("0" if d == 0 else f"{d:.3g}")


def _div_text(r: inv.PromptResult) -> str:
    d = r.first_divergence
    if d is None:
        return r.reason or "-"
    return (
        f"pos {d.position} {d.kind}: tok {d.token_alone}/{d.token_batched} "
        f"lp {d.logprob_alone!r}/{d.logprob_batched!r} Δ {_fmt_diff(d.diff)}"
    )


def _last(records: list[dict], **match: Any) -> dict | None:
    for rec in reversed(records):
        if all(rec.get(k) == v for k, v in match.items()):
            return rec
    return None


def engine_records(run_dir: Path | None) -> tuple[dict | None, list[dict], dict | None, str | None]:
    """(engine_info record, batch probe records, probe init record, vLLM version from
    the ledger) of an opsctl run directory; empties when there is none."""
    if run_dir is None:
        return None, [], None, None
    from opsctl.collectors.ledger import read_events, read_records

    infos = [r for r in read_events(run_dir, "engine_info") if "error" not in r]
    batch = read_events(run_dir, "batch")
    init = _last(batch, event="init", role="worker") or _last(batch, event="init")
    records = read_records(run_dir)
    version = records[-1].get("vllm_version") if records else None
    return (infos[-1] if infos else None), batch, init, version


def run_mode(req: Request, mode: str | None, emit: Emit, rows: list[list[str]]) -> dict:
    from opsctl.collectors import completions as cc
    from opsctl.commands.diag.common import engine_target, find_run_dir, knob_snapshot
    from opsctl.commands.diag.invariance import ISOLATING_ARGS, ISOLATING_ENV

    label = mode or "server as is"
    t_start = time.time()
    env = dict(ISOLATING_ENV)
    probes = [p for p in os.environ.get("OPSCTL_PROBES", "").split(",") if p.strip()]
    env["OPSCTL_PROBES"] = ",".join(dict.fromkeys([*probes, "batch"]))
    emit({"phase": f"{label}: preparing the engine", "columns": COLUMNS, "rows": rows})
    with engine_target(
        req.url,
        req.model,
        default_model="tiny-llama",
        extra_args=ISOLATING_ARGS,
        env=env,
        label=f"invariance-{mode or 'url'}",
        timeout=req.timeout,
        max_num_seqs=max(8, req.batch_size),
        enforce_eager=(mode == "eager"),
        knobs=req.knobs,
        api_key=req.api_key,
    ) as target:
        engine_seconds = time.time() - t_start
        run_dir = target.run_dir if not target.external else find_run_dir(target.url)
        if warn := knob_snapshot(run_dir):
            emit(warn)
        key = req.api_key
        model = cc.served_model(target.url, api_key=key)
        if model is None:
            from opsctl.errors import CheckFailed

            raise CheckFailed(f"{target.url}/v1/models listed no model")
        refusal = cc.completions_refusal(target.url, model, api_key=key)
        if refusal is not None:
            from opsctl.errors import BadInput

            raise BadInput(
                f"{target.url} does not serve /v1/completions for {model} ({refusal}); "
                "diag invariance needs a generative model"
            )
        version = cc.server_version(target.url, api_key=key)
        params = cc.CompletionParams(model, req.max_tokens, req.logprobs)
        tag_alone, tag_batch = (
            f"{req.tag}-{mode or 'url'}-bs1",
            f"{req.tag}-{mode or 'url'}-bs{req.batch_size}",
        )

        def progress(phase: str):
            def on_done(i: int, res: cc.Timed) -> None:
                state = (
                    "error: " + res.generated.error
                    if res.generated.error
                    else f"{len(res.generated.token_ids)} tokens"
                )
                emit({"events": [f"{label}: {phase} prompt {i}: {state} in {res.seconds:.2f} s"]})

            return on_done

        emit({"phase": f"{label}: BS=1: {len(req.prompts)} prompts one at a time"})
        t0 = time.time()
        alone = cc.run_alone(
            target.url, params, req.prompts, tag_alone, progress("BS=1"), api_key=key
        )
        t_alone = time.time() - t0
        emit({"phase": f"{label}: BS={req.batch_size}: prompts sent together"})
        t0 = time.time()
        together_fn = cc.run_together_list if req.batch_via == "list" else cc.run_together
        with cc.RunningSampler(target.url, api_key=key) as sampler:
            together = together_fn(
                target.url,
                params,
                req.prompts,
                tag_batch,
                req.batch_size,
                progress(f"BS={req.batch_size}"),
                api_key=key,
            )
        t_together = time.time() - t0
        sampler.settle(sum(len(t.generated.token_ids) for t in together))
        time.sleep(0.2)  # let the probe's last lines land
        info, batch_records, probe_init, ledger_version = engine_records(run_dir)

    results = [
        inv.compare(
            i,
            a.generated,
            b.generated,
            max_tokens=req.max_tokens,
            logprobs=req.logprobs,
            atol=req.atol,
        )
        for i, (a, b) in enumerate(zip(alone, together, strict=True))
    ]
    for r in results:
        rows.append(
            [
                label,
                str(r.index),
                _preview(req.prompts[r.index]),
                r.status,
                _div_text(r),
                _fmt_diff(r.largest_diff),
            ]
        )
        if not r.passed:
            emit({"events": [f"{label}: prompt {r.index}: {r.status}: {_div_text(r)}"]})
    emit({"rows": rows})

    evidence = inv.batch_from_probe(
        batch_records, tag_batch, req.batch_size
    ) or inv.batch_from_metrics(sampler.samples, req.batch_size, sampler.steps, sampler.tokens)
    settings = inv.check_engine_settings(
        info, probe_init.get("env") if probe_init else None, mode=mode
    )
    settings += inv.check_request_settings([t.generated for t in alone + together], req.max_tokens)
    extra: list[str] = [
        f"setting {s.name}: wanted {s.wanted}, engine has {s.seen}" for s in settings if s.failed
    ]
    warnings: list[str] = []
    if evidence.alone and evidence.source == "batch probe":
        extra.append(
            f"prompt(s) {list(evidence.alone)} ran alone in the BS={req.batch_size} phase "
            "(never sampled with another request): BS=N not tested for them"
        )
    elif evidence.formed is False:
        if evidence.source == "batch probe":
            extra.append(
                f"BS={req.batch_size} did not form a batch (batch probe: at most "
                f"{evidence.max_batch} request(s) per step)"
            )
        elif evidence.tokens is not None:
            warnings.append(
                f"could not show that BS={req.batch_size} formed a batch ({evidence.source}: "
                f"{evidence.tokens} tokens in {evidence.steps} steps); not conclusive without "
                "the batch probe"
            )
        else:
            warnings.append(
                f"could not show that BS={req.batch_size} formed a batch ({evidence.source}: "
                f"peak {evidence.max_batch}); the gauge is sampled, so this is not conclusive"
            )
    shared = inv.shared_steps(batch_records, tag_alone)
    if shared > 1:
        warnings.append(
            f"a BS=1 request shared a sampling step with {shared - 1} other request(s) "
            "(other traffic on this server): that side was not strictly BS=1"
        )
    elif evidence.formed is None:
        warnings.append("could not show that the batch formed (no batch probe, no metrics)")
    nudge = (probe_init or {}).get("nudge")
    if nudge:
        warnings.append(f"TEST NUDGE active in this engine (OPSCTL_PROBE_NUDGE): {nudge}")
    not_enforced = [s.name for s in settings if s.status == inv.NOT_VERIFIED]
    if not_enforced:
        warnings.append("could not enforce/verify on this server: " + ", ".join(not_enforced))
    summary = inv.summarize(results, req.atol, extra)
    platform = (
        (info or {}).get("platform")
        or ((probe_init or {}).get("platform"))
        or "unknown (external server without an opsctl ledger)"
    )
    execution = None
    if info is not None:
        execution = {
            "enforce_eager": info.get("enforce_eager"),
            "compilation_mode": inv.compilation_mode_name(info.get("compilation_mode")),
        }
    run = {
        "mode": mode or "unknown (external server)",
        "requested_mode": mode,
        "verdict": summary.verdict,
        "url": target.url,
        "external": target.external,
        "run_dir": str(run_dir) if run_dir else None,
        "model": model,
        "vllm_version": version or ledger_version,
        "platform": platform,
        "execution": execution,
        "summary": summary.to_dict(),
        "settings": [s.to_dict() for s in settings],
        "batch": {**evidence.to_dict(), "via": req.batch_via, "bs1_max_shared": shared},
        "warnings": warnings,
        "prompts": [
            {
                **r.to_dict(),
                "prompt": req.prompts[r.index],
                "seconds_alone": round(alone[r.index].seconds, 4),
                "seconds_batched": round(together[r.index].seconds, 4),
            }
            for r in results
        ],
        "seconds": {
            "engine": round(engine_seconds, 2),
            "bs1": round(t_alone, 3),
            "bsn": round(t_together, 3),
            "total": round(time.time() - t_start, 2),
        },
    }
    emit(
        {
            "phase": f"{label}: done",
            "verdict": summary.verdict,
            "summary": f"{label}: {summary.verdict} ({summary.comparison}); largest |Δ| {_fmt_diff(summary.largest_diff)}",
            "events": [
                f"{label}: verdict {summary.verdict}: {'; '.join(summary.reasons) or 'all prompts matched'}"
            ]
            + [f"{label}: warning: {w}" for w in warnings],
        }
    )
    return run


def failed_run(mode: str | None, reason: str, timed_out: bool = False) -> dict:
    """The report entry of a mode whose engine never got to run the comparison."""
    return {
        "mode": mode or "server as is",
        "verdict": "fail",
        "error": reason,
        "timed_out": timed_out,
        "summary": {
            "verdict": "fail",
            "reasons": [reason],
            "tokens_identical": False,
            "identical": 0,
            "within_atol": 0,
            "diverged": 0,
            "errors": 0,
            "largest_diff": None,
        },
        "batch": {"max_batch": 0, "source": "-"},
        "execution": None,
        "platform": "?",
        "vllm_version": None,
        "settings": [],
        "prompts": [],
        "warnings": [],
        "seconds": {"engine": "-", "bs1": "-", "bsn": "-"},
    }


def run_all(req: Request, emit: Emit) -> dict:
    from opsctl.errors import BadInput, EngineUnreachable, OpsctlError, OpsTimeout

    rows: list[list[str]] = []
    runs = []
    for mode in req.modes:
        try:
            runs.append(run_mode(req, mode, emit, rows))
        except (BadInput, EngineUnreachable):
            raise
        except OpsctlError as err:
            if len(req.modes) == 1:
                raise
            # --mode both: one mode's engine failing must not hide the other's report
            emit({"phase": f"{mode}: failed", "events": [f"{mode}: {err.message}"]})
            runs.append(failed_run(mode, err.message, timed_out=isinstance(err, OpsTimeout)))
    verdict = "pass" if runs and all(r["verdict"] == "pass" for r in runs) else "fail"
    reasons = [f"[{r['mode']}] {x}" for r in runs for x in r["summary"]["reasons"]]
    emit(
        {
            "phase": "finished",
            "verdict": verdict,
            "summary": "  |  ".join(f"{r['mode']}: {r['verdict']}" for r in runs),
        }
    )
    return {
        "verdict": verdict,
        "reasons": reasons,
        "comparison": inv.comparison_label(req.atol),
        "atol": req.atol,
        "prompts": len(req.prompts),
        "batch_size": req.batch_size,
        "batch_via": req.batch_via,
        "max_tokens": req.max_tokens,
        "logprobs": req.logprobs,
        "request_tag": req.tag,
        "runs": runs,
    }


def render(con, doc: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    runs = doc["runs"]
    head = Table(
        title=f"batch invariance: BS=1 vs BS={doc['batch_size']} ({doc['comparison']}, "
        f"{doc['prompts']} prompts x {doc['max_tokens']} tokens, top-{doc['logprobs']})"
    )
    head.add_column("")
    for r in runs:
        head.add_column(str(r["mode"]))
    colour = {"pass": "[green]PASS[/]", "fail": "[red]FAIL[/]"}

    def row(name: str, fn) -> None:
        head.add_row(name, *[str(fn(r)) for r in runs])

    row("verdict", lambda r: colour.get(r["verdict"], r["verdict"]))
    row("tokens identical", lambda r: r["summary"]["tokens_identical"])
    row(
        "identical / within atol / diverged / error",
        lambda r: "{identical} / {within_atol} / {diverged} / {errors}".format(**r["summary"]),
    )
    row("largest |Δ logprob|", lambda r: _fmt_diff(r["summary"]["largest_diff"]))
    row("batch formed", _batch_text)
    row(
        "execution",
        lambda r: ", ".join(f"{k}={v}" for k, v in (r["execution"] or {}).items()) or "?",
    )
    row("platform", lambda r: r["platform"])
    row("vLLM", lambda r: r["vllm_version"] or "?")
    row("seconds engine / BS=1 / BS=N", lambda r: "{engine} / {bs1} / {bsn}".format(**r["seconds"]))
    con.print(head)
    for r in runs:
        st = Table(title=f"{r['mode']}: isolating settings")
        for c in ("setting", "wanted", "seen", "status", "source"):
            st.add_column(c)
        for s in r["settings"]:
            style = {"verified": "green", "mismatch": "red", "not verified": "yellow"}.get(
                s["status"], ""
            )
            st.add_row(
                s["name"],
                s["wanted"],
                s["seen"],
                f"[{style}]{s['status']}[/]" if style else s["status"],
                s["source"],
            )
        con.print(st)
        pt = Table(title=f"{r['mode']}: per prompt")
        for c in (
            "#",
            "prompt",
            "status",
            "first divergence (pos, tokens, logprobs alone/batched, Δ)",
            "largest |Δ|",
        ):
            pt.add_column(c)
        for p in r["prompts"]:
            res = inv.PromptResult(
                p["index"],
                p["status"],
                p["reason"],
                inv.Divergence(**p["first_divergence"]) if p["first_divergence"] else None,
            )
            pt.add_row(
                str(p["index"]),
                escape(_preview(p["prompt"])),
                p["status"],
                escape(_div_text(res)),
                _fmt_diff(p["largest_diff"]),
            )
        con.print(pt)
        for w in r["warnings"]:
            con.print(f"[yellow]warning:[/] {escape(w)}")
    con.print(
        f"verdict: {colour.get(doc['verdict'], doc['verdict'])}  ({doc.get('seconds', '?')} s)"
    )
