"""Reproduce opsctl's kv-fail failure on CUDA vLLM and print the verdict per configuration.

Runs ``opsctl diag kv-fail`` (the library call, :func:`opsctl.suite.kv_fail.run.run`) on
tiny-llama once per named configuration, each on its own engine, and prints one line
per configuration: runner, execution mode, dtype, patch, requests targeted, blocks
reported failed, requests rescheduled, tokens recomputed, verdict, largest logprob
difference of a recovered request, and what the V2-runner trace saw (``gpu/v2hook``:
the scheduler's rewound ``num_computed_tokens`` against the runner's device-side one,
and the positions the recompute step really computed).

Configurations (NAME = [MODEL:]runner-mode-dtype[-extra]; MODEL defaults to tiny-llama):
  runner: v2 (vLLM 0.26's default on CUDA), v1 (VLLM_USE_V2_MODEL_RUNNER=0),
          v2fix (V2 with gpu/v2hook setting the device-side count to the scheduler's)
  mode:   eager (--enforce-eager, as opsctl's check engines) | graphs (vLLM's default:
          torch.compile + CUDA graphs)
  dtype:  bf16 | fp32 (--dtype float32)
  extra:  nopatch (opsctl's KV recovery patches disabled: kv_hybrid_recompute,
          kv_async_inflight, kv_rewind_v2) | sync (--no-async-scheduling) | fail
          (kv_load_failure_policy fail instead of recompute)

Run on the H200 (bundle from ../shared/tools/gpu, see docs/gpu.md), from /tmp so the
bundle's opsctl is imported, not the checkout's:
  . .gpu/bin/env.sh; R=$PWD; cd /tmp
  python3 $R/gpu/repro_kv_fail.py --out $OUT/kvfail.json --budget 540 \
      v2-eager-bf16 v1-eager-bf16 v2fix-eager-bf16
Exit 0 when every configuration ran (whatever its verdict), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

HOOK = str(Path(__file__).resolve().parent / "v2hook")
LOG_LINES = re.compile(
    r"model runner|Model Runner|attention backend|Using .*backend|Asynchronous scheduling"
    r"|cudagraph|CUDA graph|Recovered from KV load failure|Failing \d+ request|dtype=",
    re.I,
)


def facts() -> dict:
    import torch

    out: dict = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        import vllm

        out["vllm"] = vllm.__version__
    except Exception as exc:
        out["vllm"] = repr(exc)
    try:
        import opsctl

        out["opsctl"] = getattr(opsctl, "__version__", None)
        out["opsctl_file"] = opsctl.__file__
    except Exception as exc:
        out["opsctl"] = repr(exc)
    try:
        q = "--query-gpu=name,driver_version,memory.total"
        out["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", q, "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except Exception as exc:
        out["nvidia_smi"] = repr(exc)
    out["python"] = sys.version.split()[0]
    return out


def spec_for(name: str):
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.kv_fail.run import NO_PATCH

    model, _, name = name.rpartition(":")
    parts = name.split("-")
    runner, mode, dtype, extras = parts[0], parts[1], parts[2], set(parts[3:])
    if runner not in ("v1", "v2", "v2fix") or mode not in ("eager", "graphs"):
        raise SystemExit(f"bad configuration name {name!r}")
    if dtype not in ("bf16", "fp32") or not extras <= {"nopatch", "sync", "fail"}:
        raise SystemExit(f"bad configuration name {name!r}")
    env = {
        "PYTHONPATH": HOOK + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OPSCTL_GPU_V2": "fix" if runner == "v2fix" else "trace",
    }
    if runner == "v1":  # v2/v2fix: vLLM's own choice (V2 for tiny-llama on CUDA since 0.26)
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    args = ["--dtype", "bfloat16" if dtype == "bf16" else "float32"]
    if "sync" in extras:
        args.append("--no-async-scheduling")
    return EngineSpec(
        model=model or "tiny-llama",
        extra_args=tuple(args),
        env=tuple(sorted(env.items())),
        disable_patches=NO_PATCH if "nopatch" in extras else (),
        enforce_eager=mode == "eager",
        timeout=400.0,
    )


def trace_events(run_dir: str | None) -> list[dict]:
    if not run_dir:
        return []
    path = Path(run_dir) / "events" / "gpu_v2_trace.jsonl"
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def log_lines(run_dir: str | None) -> list[str]:
    if not run_dir:
        return []
    try:
        text = (Path(run_dir) / "server.log").read_text(errors="replace")
    except OSError:
        return []
    seen, out = set(), []
    for line in text.splitlines():
        if LOG_LINES.search(line) and "OPSCTL_V2TRACE" not in line:
            key = re.sub(r"^.*?\] ", "", line)[:300]
            if key not in seen:
                seen.add(key)
                out.append(line[-400:])
    return out[:40]


def summary(name: str, doc: dict, trace: list[dict]) -> dict:
    reqs = doc.get("requests") or []
    targeted = [r["index"] for r in reqs if r.get("targeted")]

    def diffs(phase: str, which: list[dict]) -> list:
        return [(r.get(phase) or {}).get("max_logprob_diff") for r in which]

    recovered = [r for r in reqs if r.get("targeted") and not r.get("failed")]
    untargeted = [r for r in reqs if not r.get("targeted")]
    mism = [e for e in trace if e.get("event") == "mismatch"]
    fwd = [e for e in trace if e.get("event") == "forward_positions"]
    return {
        "config": name,
        "verdict": doc.get("verdict"),
        "vllm_version": doc.get("vllm_version"),
        "requests_targeted": targeted,
        "blocks_reported_failed": doc.get("failures_injected"),
        "requests_rescheduled": doc.get("requests_rescheduled"),
        "tokens_recomputed": doc.get("tokens_recomputed"),
        "requests_failed": doc.get("requests_failed"),
        "engine_alive": doc.get("engine_alive"),
        "roundtrip_identical": [(r.get("roundtrip") or {}).get("identical") for r in reqs],
        "inject_identical": [(r.get("inject") or {}).get("identical") for r in reqs],
        "inject_first_divergence": [(r.get("inject") or {}).get("first_divergence") for r in reqs],
        "recovered_max_logprob_diff": diffs("inject", recovered),
        "untargeted_max_logprob_diff": diffs("inject", untargeted),
        "sensitivity_max_logprob_diff": diffs("sensitivity", recovered),
        "v2_runner_active": any(e.get("event") == "v2_runner_active" for e in trace),
        "v2_mismatches": [
            {
                k: e.get(k)
                for k in (
                    "scheduler_num_computed_tokens",
                    "runner_device_num_computed_tokens",
                    "prefill_len",
                    "scheduled_tokens",
                    "fixed",
                )
            }
            for e in mism
        ],
        "v2_recompute_positions": [
            [e.get("first_position"), e.get("last_position"), e.get("tokens")] for e in fwd
        ],
        "failures": [f["message"] for f in doc.get("findings", []) if f.get("severity") == "fail"],
        "noise_floor": doc.get("noise_floor"),
        "recovery_patches": doc.get("recovery_patches"),
    }


def line(s: dict) -> str:
    def fmt(xs):
        return "[" + ",".join("-" if x is None else f"{x:.3g}" for x in xs) + "]"

    mism = s["v2_mismatches"]
    seen = (
        "; ".join(
            f"sched {m['scheduler_num_computed_tokens']} vs runner "
            f"{m['runner_device_num_computed_tokens']}{' (fixed)' if m['fixed'] else ''}"
            for m in mism
        )
        or "no rewind mismatch"
    )
    pos = ", ".join(f"{a}..{b}" for a, b, _n in s["v2_recompute_positions"]) or "-"
    return (
        f"{s['config']:<24} verdict={s['verdict']} targeted={s['requests_targeted']} "
        f"failed_blocks={s['blocks_reported_failed']} rescheduled={s['requests_rescheduled']} recomputed={s['tokens_recomputed']} "
        f"recovered_maxdiff={fmt(s['recovered_max_logprob_diff'])} "
        f"untargeted_maxdiff={fmt(s['untargeted_max_logprob_diff'])} "
        f"roundtrip_identical={all(x is not False for x in s['roundtrip_identical'])} | "
        f"runner={'V2' if s['v2_runner_active'] else 'V1'}: {seen}; recompute positions {pos}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("configs", nargs="+")
    p.add_argument("--out", required=True, help="JSON file (rewritten after each config)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all configs")
    a = p.parse_args()
    from opsctl.suite.kv_fail import run as check

    t0 = time.time()
    result: dict = {"facts": facts(), "results": [], "skipped": []}
    took: dict[str, float] = {}
    ok = True
    from opsctl.suite.kv_fail.judge import Settings

    for name in a.configs:
        spec = spec_for(name)
        mode = name.rpartition(":")[2].split("-")[1]
        policy = "fail" if "fail" in name.rpartition(":")[2].split("-")[3:] else "recompute"
        estimate = took.get(mode, 150.0 if mode == "eager" else 240.0)
        if time.time() - t0 + estimate > a.budget:
            result["skipped"].append(name)
            print(f"{name:<24} SKIPPED (budget)", flush=True)
            continue
        c0 = time.time()
        try:
            report = check.run(spec, check.Options(Settings(policy=policy)))
            doc = report.to_dict() if hasattr(report, "to_dict") else dict(report.document)
            trace = trace_events(doc.get("run_dir"))
            s = summary(name, doc, trace)
            s["seconds"] = round(time.time() - c0, 1)
            s["engine_log"] = log_lines(doc.get("run_dir"))
            result["results"].append({"summary": s, "report": doc, "trace": trace})
            print(line(s), f"({s['seconds']} s)", flush=True)
        except Exception as exc:
            ok = False
            tb = traceback.format_exc()
            result["results"].append({"summary": {"config": name, "error": repr(exc)}, "tb": tb})
            print(f"{name:<24} ERROR {exc!r}\n{tb[-2000:]}", flush=True)
        took[mode] = max(took.get(mode, 0.0), time.time() - c0)
        Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    result["seconds"] = round(time.time() - t0, 1)
    Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
