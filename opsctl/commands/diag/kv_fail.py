"""`opsctl diag kv-fail`: KV load failures on a live engine (vLLM PR 50388).

Starts an engine with opsctl's fault-injecting KV connector
(:mod:`engine_patches.connectors.fault_kv`) and runs one workload (greedy, logprobs,
real seeded weights) through four phases on that engine: store (failure-free
baseline; the connector stores every prompt's KV for every KV cache group), round
trip (reload, nothing injected: must equal the baseline), inject (reload with failed
blocks reported: the engine must survive and every non-failed request must equal its
baseline) and sensitivity (the same blocks corrupted silently: outputs should change,
showing that the comparison would catch a missed recovery).

Reports vLLM version and platform, KV cache groups, failures injected, requests
affected, tokens recomputed (vLLM's own "tokens affected" log lines), requests failed,
engine alive, per-request equality, verdict. Exit 0 when the engine survived and every
non-failed output equals its baseline; 1 otherwise (``--no-patch`` on a hybrid model
shows the engine death the patch prevents); 2 for bad arguments.
"""

from __future__ import annotations

import typer

from opsctl.commands.options import test_knob_option
from opsctl.errors import BadInput, CheckFailed

SCHEMA = "diag.kv-fail"
DEFAULT_MODEL = "tiny-hybrid"


def build_settings(
    policy: str,
    rate: float | None,
    blocks: str | None,
    requests: int,
    seed: int,
    targets: int | None,
    max_tokens: int,
    no_patch: bool,
):
    from opsctl.domain.kv_fail import Settings

    s = Settings(
        policy=policy,
        rate=rate,
        blocks=blocks,
        requests=requests,
        seed=seed,
        targets=targets,
        max_tokens=max_tokens,
        no_patch=no_patch,
    )
    try:
        s.validate()
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return s


def check_model(model: str | None) -> str:
    from opsctl.domain.kv_fail import servable
    from opsctl.engine.model import resolve

    resolved = resolve(model)  # BadInput for unknown names / bad dirs
    why = servable(resolved.config)
    if why:
        raise BadInput(f"the fault-injecting KV connector cannot serve {resolved.name}: {why}")
    return resolved.name


def render(con, doc: dict) -> None:
    from rich.table import Table

    from opsctl.commands.diag.kv_fail_run import COLUMNS

    groups = doc.get("kv_cache_groups") or []
    con.print(
        f"[b]diag kv-fail[/] {doc.get('model')} on vLLM {doc.get('vllm_version')} ({doc.get('platform')}), "
        f"{len(groups)} KV cache group(s): "
        + ", ".join(
            f"{g.get('spec')}"
            + (f"(window {g['sliding_window']})" if g.get("sliding_window") else "")
            for g in groups
        )
    )
    patch = doc.get("patch") or {}
    inj = doc.get("injection") or {}
    con.print(
        f"policy {doc.get('kv_load_failure_policy')}; patch {patch.get('name')}: {patch.get('status')}; "
        f"injection {inj.get('mode')} {inj.get('rate') if inj.get('mode') == 'rate' else inj.get('blocks')} "
        f"seed {inj.get('seed')} on requests {inj.get('targets')}"
    )
    table = Table(*COLUMNS)

    def cell(c):
        if not c:
            return "-"
        return (
            "identical"
            if c["identical"]
            else f"differs (max |dlogprob| {c.get('max_logprob_diff')})"
        )

    for r in doc.get("requests", []):
        outcome = "failed" if r["failed"] else (r.get("finish_reason") or "-")
        table.add_row(
            str(r["index"]),
            str(r["prompt_tokens"]),
            "yes" if r["targeted"] else "no",
            cell(r.get("roundtrip")),
            str(r["injected_blocks"]),
            outcome,
            "n/a" if r["failed"] else cell(r.get("inject")),
            cell(r.get("sensitivity")),
        )
    con.print(table)
    con.print(
        f"failures injected {doc['failures_injected']}, requests affected {doc['requests_affected']}, "
        f"tokens recomputed {doc['tokens_recomputed']} (engine), requests failed {doc['requests_failed']}, "
        f"engine alive {'yes' if doc['engine_alive'] else '[red]NO[/]'}, "
        f"outputs identical {'yes' if doc['outputs_identical'] else 'no'}"
    )
    from opsctl.output import render_findings

    render_findings(
        con,
        doc.get("findings", []),
        doc["verdict"],
        f"  ({doc.get('seconds')} s, run {doc.get('run_dir')})",
    )


def register(app: typer.Typer) -> None:
    @app.command("kv-fail")
    def kv_fail(
        model: str = typer.Option(
            DEFAULT_MODEL, "--model", help="tiny-llama | tiny-hybrid | model dir"
        ),
        policy: str = typer.Option(
            "recompute", "--policy", help="kv_load_failure_policy: recompute | fail"
        ),
        rate: float = typer.Option(
            None, "--rate", help="fail each loaded block with probability R (0..1)"
        ),
        blocks: str = typer.Option(
            None,
            "--blocks",
            help="fail block positions: POS or GROUP:POS, comma-separated "
            "(negative from the end; default -1 = last loaded block of every group)",
        ),
        requests: int = typer.Option(4, "--requests", help="requests in the workload"),
        seed: int = typer.Option(0, "--seed", help="seed of prompts, targets and rate draws"),
        targets: int = typer.Option(
            None, "--targets", help="requests that get injections (default: half; with --rate: all)"
        ),
        max_tokens: int = typer.Option(16, "--max-tokens", help="tokens generated per request"),
        no_patch: bool = typer.Option(
            False, "--no-patch", help="run vanilla vLLM (kv_hybrid_recompute off)"
        ),
        timeout: float = typer.Option(
            600.0, "--timeout", help="seconds to wait for the engine to start"
        ),
        as_json: bool = typer.Option(False, "--json"),
        tui: bool = typer.Option(False, "--tui", help="live injections and recoveries"),
        test_knob: list[str] | None = test_knob_option(),
    ) -> None:
        """Inject KV load failures and prove recovery (exit 0: engine alive, outputs equal)."""
        from opsctl import output
        from opsctl.commands.diag.common import add_knob_warnings, run_pipeline, warn_test_knobs
        from opsctl.commands.diag.kv_fail_run import Request, run
        from opsctl.commands.options import parse_knobs

        settings = build_settings(
            policy, rate, blocks, requests, seed, targets, max_tokens, no_patch
        )
        if timeout <= 0:
            raise BadInput("--timeout must be positive")
        check_model(model)
        req = Request(model, settings, timeout=timeout, knobs=parse_knobs(test_knob))
        report = run_pipeline("diag kv-fail", lambda emit: run(req, emit), tui=tui, as_json=as_json)
        doc = add_knob_warnings(output.document(SCHEMA, **report), [report.get("run_dir")])
        warn_test_knobs(doc)
        output.emit(doc, as_json=as_json, render=lambda con: render(con, doc))
        if report["verdict"] != "pass":
            reasons = [f["message"] for f in report.get("findings", []) if f["severity"] == "fail"]
            raise CheckFailed(
                "kv-fail: " + "; ".join(reasons)[:600] if reasons else "kv-fail check failed",
                hint=f"run dir: {report.get('run_dir')}",
            )
