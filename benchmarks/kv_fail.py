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
import contextlib
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

ENGINE_ARGS = ("--block-size", "32", "--no-enable-prefix-caching")


def timed_round(probe, name: str, prompts, max_tokens: int):
    t0 = time.perf_counter()
    outs = [probe.complete(name, p, max_tokens, 180) for p in prompts]
    return time.perf_counter() - t0, outs


@contextlib.contextmanager
def engine(model: str, args: tuple[str, ...], label: str):
    """A KvProbe on an engine started for the block (stopped when it ends)."""
    from opsctl.checks.session import EngineSession
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.kv_fail.collect import KvProbe

    with EngineSession() as session:
        live = session.engine(EngineSpec(model=model, extra_args=args), label=label)
        with KvProbe(live.url, live.run_dir, live.server) as probe:
            yield probe


def connector_rounds(probe, name: str, warm, prompts, reps: int, max_tokens: int) -> dict:
    from engine_patches.connectors.injection import InjectionPlan
    from opsctl.suite.kv_fail import judge as dom

    res: dict = {"groups": len(probe.engine_info().get("kv_cache_groups") or [])}
    probe.set_plan(InjectionPlan(enabled=False, epoch="warm"))
    timed_round(probe, name, warm, max_tokens)
    probe.set_plan(InjectionPlan(enabled=False, epoch="store"))
    res["store_round_s"], base = timed_round(probe, name, prompts, max_tokens)
    clean, inj, tokens, failed, mism = [], [], [], 0, 0
    for i in range(reps):
        probe.set_plan(InjectionPlan(enabled=False, epoch=f"clean{i}"))
        secs, outs = timed_round(probe, name, prompts, max_tokens)
        clean.append(secs)
        mism += sum(not dom.compare(b, o).identical for b, o in zip(base, outs, strict=True))
    for i in range(reps):
        probe.set_plan(InjectionPlan(blocks="-1", epoch=f"inject{i}"))  # every request
        mark = probe.log_mark()
        secs, outs = timed_round(probe, name, prompts, max_tokens)
        inj.append(secs)
        # vLLM logs each recovery a moment after the answer: wait for all, with a deadline
        log = probe.log_until(mark, lambda text: dom.recovery_logged(text, len(prompts)), 5.0)
        tokens.append(dom.account(log).recomputed_tokens)
        failed += sum(o.failed for o in outs)
        mism += sum(
            not dom.compare(b, o).identical for b, o in zip(base, outs, strict=True) if not o.failed
        )
    res["alive"] = probe.alive()
    return {
        **res,
        "reload_round_s": statistics.median(clean),
        "injected_round_s": statistics.median(inj),
        "recomputed_tokens_per_round": statistics.median(tokens),
        "failed_requests": failed,
        "mismatches": mism,
    }


def bench_model(model: str, n: int, reps: int, max_tokens: int) -> dict:
    from engine_patches.connectors.injection import kv_transfer_config
    from opsctl.engine.model import resolve
    from opsctl.suite.kv_fail import judge as dom

    resolved = resolve(model)
    vocab = int(resolved.config.get("vocab_size") or 320)
    warm = dom.make_prompts(n, 1000, vocab)
    prompts = dom.make_prompts(n, 0, vocab)
    res: dict = {"model": model, "requests": n, "reps": reps}
    args = ("--kv-transfer-config", kv_transfer_config(policy="recompute"), *ENGINE_ARGS)
    with engine(model, args, "bench-kv-fail") as probe:
        res.update(connector_rounds(probe, resolved.name, warm, prompts, reps, max_tokens))
    res["prompt_tokens"] = sum(len(p) for p in prompts)
    with engine(model, ENGINE_ARGS, "bench-kv-plain") as probe:
        timed_round(probe, resolved.name, warm, max_tokens)
        plain = [timed_round(probe, resolved.name, prompts, max_tokens)[0] for _ in range(reps)]
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
