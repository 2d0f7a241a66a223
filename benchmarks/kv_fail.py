"""KV load failure recovery cost on CPU: single-group truncation vs hybrid whole-request
recompute, and the overhead of the fault-injecting connector when it injects nothing.

For each model (default tiny-llama: one KV cache group; tiny-hybrid: two) it starts
  1. an engine with the connector (policy recompute): a warm-up round, a store round
     (compute + save KV), REPS failure-free reload rounds, REPS injected rounds
     (the last loaded block of every group of every request reported failed);
  2. an engine without any connector: a warm-up round and REPS rounds.
Every round sends the same N prompts one after another (greedy, 16 tokens).
Recomputed tokens come from vLLM's own "tokens affected" log lines.

    python benchmarks/kv_fail.py [--models tiny-llama,tiny-hybrid] [--requests 8] [--reps 3]

Engine starts: 2 per model. Prints the figures; exits 1 if an engine died or an
injected round failed a request.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")
# vLLM's CPU platform reserves an extra core when a KV connector is configured, so the
# connector engine and the plain engine would run different OpenMP thread counts; pin
# the reservation so both engines compute with the same threads.
os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")

ENGINE_ARGS = ["--block-size", "32", "--no-enable-prefix-caching"]


def timed_round(client, url: str, name: str, prompts: list[list[int]], max_tokens: int):
    from opsctl.commands.diag.kv_fail_run import _complete

    t0 = time.perf_counter()
    outs = [_complete(client, url, name, p, max_tokens, 180) for p in prompts]
    return time.perf_counter() - t0, outs


def bench_model(model: str, n: int, reps: int, max_tokens: int) -> dict:
    import httpx

    from engine_patches.connectors import kv_transfer_config
    from opsctl.commands.diag.common import engine_target
    from opsctl.commands.diag.kv_fail_run import _write_control
    from opsctl.domain import kv_fail as dom
    from opsctl.engine.model import resolve

    resolved = resolve(model)
    vocab = int(resolved.config.get("vocab_size") or 320)
    warm = dom.make_prompts(n, 1000, vocab)
    prompts = dom.make_prompts(n, 0, vocab)
    res: dict = {"model": model, "requests": n, "reps": reps}
    cfg = kv_transfer_config(policy="recompute", inject={"enabled": False})
    with (
        engine_target(
            None,
            model,
            extra_args=["--kv-transfer-config", cfg, *ENGINE_ARGS],
            label="bench-kv-fail",
            max_model_len=256,
        ) as t,
        httpx.Client() as c,
    ):
        from opsctl.collectors.ledger import read_events

        store = t.run_dir / "kv_store"
        res["groups"] = len(
            (read_events(t.run_dir, "engine_info") or [{}])[-1].get("kv_cache_groups") or []
        )
        _write_control(store, {"enabled": False, "epoch": "warm"})
        timed_round(c, t.url, resolved.name, warm, max_tokens)
        _write_control(store, {"enabled": False, "epoch": "store"})
        res["store_round_s"], base = timed_round(c, t.url, resolved.name, prompts, max_tokens)
        clean, inj, tokens, failed, mism = [], [], [], 0, 0
        for i in range(reps):
            _write_control(store, {"enabled": False, "epoch": f"clean{i}"})
            secs, outs = timed_round(c, t.url, resolved.name, prompts, max_tokens)
            clean.append(secs)
            mism += sum(not dom.compare(b, o).identical for b, o in zip(base, outs, strict=True))
        for i in range(reps):
            _write_control(store, {"blocks": "-1", "epoch": f"inject{i}"})
            log_from = len(t.server.log_text())
            secs, outs = timed_round(c, t.url, resolved.name, prompts, max_tokens)
            time.sleep(0.5)
            inj.append(secs)
            tokens.append(dom.account(t.server.log_text()[log_from:]).recomputed_tokens)
            failed += sum(o.failed for o in outs)
            mism += sum(
                not dom.compare(b, o).identical
                for b, o in zip(base, outs, strict=True)
                if not o.failed
            )
        res["alive"] = t.server.exited() is None and t.server.health(c)
    res.update(
        reload_round_s=statistics.median(clean),
        injected_round_s=statistics.median(inj),
        recomputed_tokens_per_round=statistics.median(tokens),
        failed_requests=failed,
        mismatches=mism,
        prompt_tokens=sum(len(p) for p in prompts),
    )
    with (
        engine_target(
            None, model, extra_args=ENGINE_ARGS, label="bench-kv-plain", max_model_len=256
        ) as t,
        httpx.Client() as c,
    ):
        timed_round(c, t.url, resolved.name, warm, max_tokens)
        plain = [timed_round(c, t.url, resolved.name, prompts, max_tokens)[0] for _ in range(reps)]
    res["plain_round_s"] = statistics.median(plain)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny-llama,tiny-hybrid")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    results = [
        bench_model(m.strip(), args.requests, args.reps, args.max_tokens)
        for m in args.models.split(",")
        if m.strip()
    ]
    print(
        f"\nKV load failure benchmark: {args.requests} requests/round, median of {args.reps} rounds, "
        f"{args.max_tokens} tokens each, CPU ({os.cpu_count()} cores)"
    )
    head = (
        f"{'model':<12} {'groups':>6} {'plain s':>8} {'store s':>8} {'reload s':>9} {'inject s':>9} "
        f"{'recomp tok':>10} {'tok/req':>8} {'store ovh':>9} {'fail':>5} {'diff':>5}"
    )
    print(head)
    ok = True
    for r in results:
        per_req = r["recomputed_tokens_per_round"] / r["requests"]
        print(
            f"{r['model']:<12} {r['groups']:>6} {r['plain_round_s']:>8.3f} {r['store_round_s']:>8.3f} "
            f"{r['reload_round_s']:>9.3f} {r['injected_round_s']:>9.3f} {r['recomputed_tokens_per_round']:>10.0f} "
            f"{per_req:>8.1f} {r['store_round_s'] / r['plain_round_s'] - 1:>+8.1%} "
            f"{r['failed_requests']:>5} {r['mismatches']:>5}"
        )
        ok = ok and r["alive"] and not r["failed_requests"] and not r["mismatches"]
    print(
        "plain: no connector; store: connector attached, computing and saving; reload: loading, nothing "
        "injected; inject: last loaded block of every group failed (single group truncates to the valid "
        "prefix, hybrid recomputes the whole request); store ovh: store round vs plain round"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
