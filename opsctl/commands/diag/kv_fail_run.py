"""The `diag kv-fail` pipeline: start an engine with the fault-injecting connector, run
the phases of :mod:`opsctl.domain.kv_fail` and collect what the engine itself says.

``run(req, emit) -> report``; ``emit`` gets progress snapshots (DiagPanel format).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from opsctl.domain import kv_fail as dom

PATCH_NAME = "kv_hybrid_recompute"
COLUMNS = [
    "#",
    "prompt",
    "target",
    "round trip",
    "injected",
    "outcome",
    "vs baseline",
    "silent corrupt",
]


@dataclass(frozen=True)
class Request:
    model: str | None
    settings: dom.Settings
    timeout: float = 600.0
    request_timeout: float = 180.0
    knobs: dict[str, str] | None = None  # test knobs for the engine (--test-knob)


class _Phases:
    """Mutable progress shared by the phases (kept out of the domain facts)."""

    def __init__(
        self, req: Request, emit, prompts: list[list[int]], targets: list[int], model_name: str
    ) -> None:
        self.req = req
        self.model_name = model_name
        self.emit = emit
        self.prompts = prompts
        self.targets = set(targets)
        self.keys = dom.keys_of(prompts)
        self.baseline: list[dom.Output] = []
        self.rows = [dom.RequestRow(i, len(p), i in self.targets) for i, p in enumerate(prompts)]
        self.phase = "starting"
        self.seen_events: Counter[str] = Counter()

    def table(self) -> list[list[str]]:
        def cell(c: dom.Comparison | None) -> str:
            if c is None:
                return "-"
            return (
                "identical"
                if c.identical
                else ("tokens ok" if c.tokens_equal else f"differs@{c.first_divergence}")
            )

        rows = []
        for r in self.rows:
            out = r.inject_output
            outcome = (
                "-" if out is None else ("failed" if out.failed else (out.finish_reason or "ok"))
            )
            rows.append(
                [
                    str(r.index),
                    str(r.prompt_tokens),
                    "yes" if r.targeted else "no",
                    cell(r.roundtrip),
                    str(r.injected_blocks),
                    outcome,
                    "n/a" if r.failed else cell(r.inject),
                    cell(r.sensitivity),
                ]
            )
        return rows

    def snap(self, events: list[str] | None = None, **extra) -> None:
        self.emit(
            {
                "title": "diag kv-fail",
                "phase": self.phase,
                "columns": COLUMNS,
                "rows": self.table(),
                "events": events or [],
                **extra,
            }
        )


def _write_control(store: Path, plan: dict) -> None:
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / ".control.json.tmp"
    tmp.write_text(json.dumps({"inject": plan}))
    tmp.replace(store / "control.json")
    time.sleep(0.05)  # distinct mtime even on coarse file systems


def _complete(
    client, url: str, model: str, prompt: list[int], max_tokens: int, timeout: float
) -> dom.Output:
    import httpx

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    try:
        r = client.post(f"{url}/v1/completions", json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        return dom.Output(False, error=f"{type(exc).__name__}: {exc}"[:200])
    try:
        data = r.json()
    except ValueError:
        data = r.text
    return dom.output_from_response(r.status_code, data)


def _alive(server, client) -> bool:
    if server.exited() is not None:
        return False
    return server.health(client)


def _still_alive(server, client, settle: float = 5.0) -> bool:
    """After a failed request: is the engine still serving? A dead EngineCore makes
    /health fail (or the server exit) within moments; re-check for ``settle`` s."""
    deadline = time.time() + settle
    while True:
        if _alive(server, client):
            return True
        if time.time() > deadline or server.exited() is not None:
            return False
        time.sleep(0.5)


def _new_events(ph: _Phases, run_dir: Path, kind: str) -> list[dict]:
    from opsctl.collectors.ledger import read_events

    events = read_events(run_dir, kind)
    fresh = events[ph.seen_events[kind] :]
    ph.seen_events[kind] = len(events)
    return fresh


def _event_lines(ph: _Phases, run_dir: Path) -> list[str]:
    lines = []
    key_index = {k: i for i, k in enumerate(ph.keys)}
    for e in _new_events(ph, run_dir, "kv_injections"):
        i = key_index.get(e.get("key"), "?")
        verb = "injected" if e.get("reported", True) else "corrupted silently"
        lines.append(
            f"{verb}: request #{i} group {e.get('group')} block {e.get('block')} "
            f"position {e.get('position')} ({e.get('epoch')})"
        )
    for e in _new_events(ph, run_dir, "kv_recoveries"):
        lines.append(
            f"patch: {e.get('action')} {e.get('requests')} request(s), {e.get('tokens')} tokens "
            f"({e.get('groups')} KV cache groups, policy {e.get('policy')})"
        )
    return lines


def _round(
    ph: _Phases, target, client, name: str, store: Path, plan: dict
) -> list[dom.Output] | None:
    """One pass over every prompt; None when the engine died (the rest is not sent)."""
    server = target.server
    ph.phase = name
    _write_control(store, plan)
    outs: list[dom.Output] = []
    for i, prompt in enumerate(ph.prompts):
        out = _complete(
            client,
            target.url,
            ph.model_name,
            prompt,
            ph.req.settings.max_tokens,
            ph.req.request_timeout,
        )
        outs.append(out)
        if name == "inject":
            ph.rows[i].inject_output = out
        if not out.ok and not _still_alive(server, client):
            ph.snap(
                [*_event_lines(ph, target.run_dir), f"engine died at request #{i}: {out.error}"]
            )
            return None
        ph.snap(_event_lines(ph, target.run_dir))
    return outs


def run(req: Request, emit) -> dict:
    from engine_patches.connectors import kv_transfer_config
    from opsctl.collectors import http
    from opsctl.collectors.ledger import read_events, read_records
    from opsctl.collectors.metrics import fetch_metrics
    from opsctl.commands.diag.common import engine_target, knob_snapshot
    from opsctl.engine.model import resolve

    s = req.settings
    resolved = resolve(req.model)
    vocab = int(resolved.config.get("vocab_size") or 320)
    prompts = dom.make_prompts(s.requests, s.seed, vocab)
    targets = (
        []
        if s.rate is not None and s.targets is None
        else dom.choose_targets(s.requests, s.seed, s.targets)
    )
    if s.rate is not None and s.targets is None:
        targets = list(range(s.requests))  # a rate applies to every request
    ph = _Phases(req, emit, prompts, targets, resolved.name)
    target_keys = tuple(ph.keys[i] for i in targets)
    extra = [
        "--kv-transfer-config",
        kv_transfer_config(policy=s.policy, inject={"enabled": False}),
        "--block-size",
        str(dom.BLOCK_SIZE),
        "--no-enable-prefix-caching",
    ]
    facts = dom.Facts(s, None, None, None, ph.rows)
    started = time.time()
    ph.snap(
        [
            f"{s.requests} requests, targets {targets}, policy {s.policy}, "
            f"{'rate ' + str(s.rate) if s.rate is not None else 'blocks ' + (s.blocks or '-1')}"
        ]
    )
    with (
        engine_target(
            None,
            req.model,
            extra_args=extra,
            label="kv-fail",
            timeout=req.timeout,
            disable_patches=[PATCH_NAME] if s.no_patch else None,
            max_model_len=256,
            knobs=req.knobs,
        ) as target,
        http.client() as client,
    ):
        run_dir: Path = target.run_dir
        if warn := knob_snapshot(run_dir):
            emit(warn)
        store = run_dir / "kv_store"
        server = target.server
        info = (read_events(run_dir, "engine_info") or [{}])[-1]
        facts.groups = len(info.get("kv_cache_groups") or []) or None
        facts.policy_seen = info.get("kv_load_failure_policy")
        phase_secs: dict[str, float] = {}

        t0 = time.time()
        base = _round(ph, target, client, "store", store, {"enabled": False, "epoch": "store"})
        phase_secs["store"] = round(time.time() - t0, 3)
        if base is None:
            facts.died_in = "store"
        else:
            ph.baseline = base
            t0 = time.time()
            trip = _round(
                ph, target, client, "roundtrip", store, {"enabled": False, "epoch": "roundtrip"}
            )
            phase_secs["roundtrip"] = round(time.time() - t0, 3)
            if trip is None:
                facts.died_in = "roundtrip"
            else:
                for r, out in zip(ph.rows, trip, strict=True):
                    r.roundtrip = dom.compare(base[r.index], out)
                loads = [
                    e
                    for e in read_events(run_dir, "kv_transfers")
                    if e.get("op") == "load" and e.get("epoch") == "roundtrip"
                ]
                facts.roundtrip_loads = len({e.get("key") for e in loads if e.get("blocks")})
        if facts.died_in is None:
            log_from = len(server.log_text())
            before = fetch_metrics(client, target.url)
            t0 = time.time()
            plan = s.plan(target_keys, "inject").to_json()
            inj = _round(ph, target, client, "inject", store, plan)
            phase_secs["inject"] = round(time.time() - t0, 3)
            time.sleep(1.0)  # let the EngineCore's log lines land
            segment = server.log_text()[log_from:]
            facts.accounting = dom.account(segment)
            if inj is None or not _alive(server, client):
                facts.died_in = "inject"
                facts.death = dom.death_lines(segment) or dom.death_lines(server.log_text())
            else:
                after = fetch_metrics(client, target.url)
                for r in ph.rows:
                    if r.inject_output is not None and not r.inject_output.failed:
                        r.inject = dom.compare(base[r.index], r.inject_output)
                facts.metrics = {
                    k: (after.get(k) or 0) - (before.get(k) or 0)
                    for k in (
                        "vllm:external_prefix_cache_hits_total",
                        "vllm:num_preemptions_total",
                        "vllm:request_success_total",
                    )
                }
        injections = [
            e for e in read_events(run_dir, "kv_injections") if e.get("epoch") == "inject"
        ]
        facts.injections = len(injections)
        per_key = Counter(e.get("key") for e in injections)
        for r in ph.rows:
            r.injected_blocks = per_key.get(ph.keys[r.index], 0)
        if facts.died_in is None and facts.injections:
            t0 = time.time()
            silent = s.plan(target_keys, "sensitivity", silent=True).to_json()
            sens = _round(ph, target, client, "sensitivity", store, silent)
            phase_secs["sensitivity"] = round(time.time() - t0, 3)
            if sens is None:
                facts.died_in = "sensitivity"
            else:
                facts.sensitivity_ran = True
                for r, out in zip(ph.rows, sens, strict=True):
                    r.sensitivity = dom.compare(base[r.index], out)
        facts.engine_alive = facts.died_in is None and _alive(server, client)
        records = read_records(run_dir)
        recoveries = read_events(run_dir, "kv_recoveries")
        ph.phase = "done"
        report = _report(req, resolved, run_dir, info, records, recoveries, facts, ph, phase_secs)
        ph.snap(
            _event_lines(ph, run_dir),
            verdict=report["verdict"],
            summary=f"injected {facts.injections} block(s), {report['tokens_recomputed']} tokens recomputed, "
            f"{report['requests_failed']} failed, engine {'alive' if report['engine_alive'] else 'DEAD'}",
        )
    report["seconds"] = round(time.time() - started, 2)
    return report


def _report(
    req, resolved, run_dir, info, records, recoveries, facts: dom.Facts, ph: _Phases, phase_secs
) -> dict:
    core = next(
        (r for r in records if r.get("role") == "engine_core"), records[0] if records else {}
    )
    patch = next((p for p in core.get("patches", []) if p.get("name") == PATCH_NAME), {})
    s = req.settings
    summ = dom.summary(facts)
    return {
        "vllm_version": core.get("vllm_version"),
        "platform": core.get("platform") or info.get("platform"),
        "model": resolved.name,
        "kv_cache_groups": info.get("kv_cache_groups"),
        "kv_load_failure_policy": facts.policy_seen or s.policy,
        "patch": {
            "name": PATCH_NAME,
            "status": patch.get("status"),
            "detail": (patch.get("detail") or "").splitlines()[0] if patch.get("detail") else None,
        },
        "injection": {
            "mode": s.mode,
            "rate": s.rate,
            "blocks": None if s.rate is not None else (s.blocks or "-1"),
            "seed": s.seed,
            "targets": sorted(ph.targets),
        },
        **summ,
        "tokens_recomputed_by_patch": sum(
            int(e.get("tokens") or 0) for e in recoveries if e.get("action") == "recomputed"
        ),
        "engine_death": facts.death or None,
        "died_in_phase": facts.died_in,
        "metrics_delta": facts.metrics or None,
        "phase_seconds": phase_secs,
        "requests": [r.to_dict() for r in facts.rows],
        "baseline": [o.to_dict() for o in ph.baseline],
        "prompts": ph.prompts,
        "run_dir": str(run_dir),
    }
