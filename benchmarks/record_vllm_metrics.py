"""Record a real vLLM /metrics body (plus /version and /v1/models) from a bare tiny-llama
server after some traffic, into tests/data/, for the console's stand-ins and benchmark.

    python benchmarks/record_vllm_metrics.py
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OPSCTL_HOME", str(REPO / ".opsctl-home"))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")

from opsctl.engine.model import resolve  # noqa: E402
from tests.bare_vllm import bare_vllm  # noqa: E402

OUT = REPO / "tests" / "data"


def traffic(url: str) -> None:
    def one(i: int) -> None:
        body = {"model": "tiny-llama", "prompt": f"hello {i} " * (4 + i), "max_tokens": 32}
        httpx.post(f"{url}/v1/completions", json=body, timeout=60).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))


def main() -> int:
    with bare_vllm(str(resolve("tiny-llama").path)) as server:
        traffic(server.url)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "vllm_metrics_tiny_llama.txt").write_text(httpx.get(f"{server.url}/metrics").text)
        extra = {
            "version": httpx.get(f"{server.url}/version").json(),
            "models": httpx.get(f"{server.url}/v1/models").json(),
        }
        (OUT / "vllm_info_tiny_llama.json").write_text(json.dumps(extra, indent=2) + "\n")
    print(f"recorded into {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
